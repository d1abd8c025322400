#include <zbar.h>

/* zbar_fourcc is a function-like macro: Swift cannot call it. */
static inline unsigned long lmx_zbar_format_y800(void) { return zbar_fourcc('Y', '8', '0', '0'); }
