#ifndef LMX_CDBUS_SHIM_H
#define LMX_CDBUS_SHIM_H

/* libdbus-1 (from libdbus-1-dev, which libavahi-client-dev already pulls in): the agent listens
   for logind's PrepareForSleep signal on the system bus. */
#include <dbus/dbus.h>

#endif
