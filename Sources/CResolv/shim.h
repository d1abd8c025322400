#ifndef LMX_CRESOLV_SHIM_H
#define LMX_CRESOLV_SHIM_H

/* glibc's stub resolver (libresolv): unicast DNS queries through the system's configuration
 * (/etc/resolv.conf: its name servers, search domains, timeout and attempts), and its message
 * parser (ns_initparse / ns_parserr / dn_expand). Each call gets a resolver state of its own, so
 * calls on several threads at once are safe. The helpers below stand for the macros and the
 * state structure Swift cannot use directly. */

#include <string.h>
#include <stdio.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <resolv.h>
#include <netdb.h>

/* One query (class IN) of `name` for `type`, through the configured name servers, with at most
 * `timeout` seconds per try and `attempts` tries (0: as resolv.conf says). The answer goes to
 * `answer`; returns its length, or -1 with *h_error set (HOST_NOT_FOUND: no such name; NO_DATA:
 * the name has no record of that type; TRY_AGAIN: no server answered; NETDB_INTERNAL: no
 * configuration). The search list is not applied: `name` is taken as absolute. */
static inline int lmx_res_query(const char *name, int type, int timeout, int attempts, unsigned char *answer,
                                int size, int *h_error) {
    struct __res_state state;
    memset(&state, 0, sizeof state);
    if (res_ninit(&state) != 0) {
        *h_error = NETDB_INTERNAL;
        return -1;
    }
    if (timeout > 0) state.retrans = timeout;
    if (attempts > 0) state.retry = attempts;
    int length = res_nquery(&state, name, ns_c_in, type, answer, size);
    *h_error = state.res_h_errno;
    res_nclose(&state);
    return length;
}

/* The search domains (newline-separated) and the first name server (as text) of the system's
 * configuration, written to the buffers; returns 0, or -1 when there is no configuration. */
static inline int lmx_res_configuration(char *domains, size_t domains_size, char *server, size_t server_size) {
    struct __res_state state;
    memset(&state, 0, sizeof state);
    if (res_ninit(&state) != 0) return -1;
    size_t used = 0;
    domains[0] = 0;
    for (int i = 0; i < MAXDNSRCH && state.dnsrch[i] != NULL; i++) {
        int written = snprintf(domains + used, domains_size - used, "%s\n", state.dnsrch[i]);
        if (written < 0 || (size_t)written >= domains_size - used) break;
        used += (size_t)written;
    }
    server[0] = 0;
    if (state.nscount > 0 && state.nsaddr_list[0].sin_family == AF_INET)
        inet_ntop(AF_INET, &state.nsaddr_list[0].sin_addr, server, (socklen_t)server_size);
    res_nclose(&state);
    return 0;
}

/* ns_msg_count as a function. */
static inline int lmx_ns_msg_count(const ns_msg *message, ns_sect section) { return ns_msg_count(*message, section); }

#endif
