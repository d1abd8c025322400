#ifndef LMX_CLINUX_SHIM_H
#define LMX_CLINUX_SHIM_H

/* The kernel structures the agent reads and writes, from the kernel's own UAPI headers
 * (linux-libc-dev) and eventfd, so that no Swift file holds a structure's byte offset:
 * netlink and rtnetlink (network changes), sock_diag / inet_diag (who owns a loopback socket),
 * and the peer credentials of a Unix socket; and glibc's allocator (malloc.h, which Swift's Glibc
 * module does not include: malloc_trim, mallopt, mallinfo2). Nothing to link: structures,
 * constants, a declaration and a few inline helpers for the function-like macros Swift does not
 * import. */

#include <stdint.h>
#include <stddef.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/inet_diag.h>
#include <sys/eventfd.h>
#include <malloc.h>

/* Linux's `struct ucred` (SO_PEERCRED), which glibc declares only under _GNU_SOURCE: the
 * kernel's layout, pid_t, uid_t and gid_t being 32-bit on every Linux ABI. */
struct lmx_ucred {
    int32_t pid;
    uint32_t uid;
    uint32_t gid;
};

/* NLMSG_ALIGN, NLMSG_HDRLEN and NLMSG_LENGTH as functions. */
static inline size_t lmx_nlmsg_align(size_t length) { return NLMSG_ALIGN(length); }
static inline size_t lmx_nlmsg_hdrlen(void) { return NLMSG_HDRLEN; }
static inline size_t lmx_nlmsg_length(size_t payload) { return NLMSG_LENGTH(payload); }

/* The rtnetlink groups the agent follows: links, IPv4/IPv6 addresses and routes. */
static inline uint32_t lmx_rtnetlink_groups(void) {
    return RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_IFADDR | RTMGRP_IPV6_ROUTE;
}

/* glibc's malloc_trim (malloc.h) gives the pages of freed heap memory back to the kernel, in every
 * arena (not only the top of the heap); 1 when any were given back.
 * The most heaps (arenas) glibc's allocator keeps: by default up to eight per core, one for each
 * thread that allocates while another holds a heap; each keeps its own free memory resident.
 * 1 on success (M_ARENA_MAX, a macro Swift imports as no constant). */
static inline int lmx_limit_malloc_arenas(int count) { return mallopt(M_ARENA_MAX, count); }

/* The bytes glibc's allocator has handed out and not had back: from its heaps (mallinfo2's
 * uordblks) and as blocks of their own (hblkhd). It walks every heap's free lists: microseconds,
 * for a periodic look, not a request's path. */
static inline size_t lmx_malloc_in_use(void) {
    struct mallinfo2 info = mallinfo2();
    return info.uordblks + info.hblkhd;
}

#endif
