#ifndef LMX_CSQLITE_SHIM_H
#define LMX_CSQLITE_SHIM_H

/* The system SQLite (libsqlite3-dev). */
#include <sqlite3.h>

#endif
