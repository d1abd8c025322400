#ifndef LMX_CAVAHI_SHIM_H
#define LMX_CAVAHI_SHIM_H

#include <avahi-client/client.h>
#include <avahi-client/lookup.h>
#include <avahi-common/address.h>
#include <avahi-common/error.h>
#include <avahi-common/malloc.h>
#include <avahi-common/strlst.h>
#include <avahi-common/thread-watch.h>
#include <avahi-common/timeval.h>
#include <avahi-common/watch.h>
#include <net/if.h>

/* AvahiPoll's members are function pointers in a struct; these helpers keep
   the pointer arithmetic out of Swift. */
static inline AvahiTimeout *lmx_avahi_timeout_new(const AvahiPoll *api, const struct timeval *tv,
                                                  AvahiTimeoutCallback callback, void *userdata) {
    return api->timeout_new(api, tv, callback, userdata);
}

static inline void lmx_avahi_timeout_update(const AvahiPoll *api, AvahiTimeout *t, const struct timeval *tv) {
    api->timeout_update(t, tv);
}

static inline void lmx_avahi_timeout_free(const AvahiPoll *api, AvahiTimeout *t) {
    api->timeout_free(t);
}

#endif
