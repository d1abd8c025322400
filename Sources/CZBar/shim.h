#include <zbar.h>

/* zbar_fourcc is a function-like macro: Swift cannot call it. */
static inline unsigned long lmx_zbar_format_y800(void) { return zbar_fourcc('Y', '8', '0', '0'); }

/* libzbar is opened when lmx-pair first reads an image (LMXImage/ImageLibraries.swift), not
   linked: the daemon shares the multi-call binary and never maps it. The functions' exact types,
   taken from the header (typeof does not reference the symbols). */
typedef __typeof__(&zbar_image_scanner_create) lmx_zbar_image_scanner_create;
typedef __typeof__(&zbar_image_scanner_destroy) lmx_zbar_image_scanner_destroy;
typedef __typeof__(&zbar_image_scanner_set_config) lmx_zbar_image_scanner_set_config;
typedef __typeof__(&zbar_image_create) lmx_zbar_image_create;
typedef __typeof__(&zbar_image_destroy) lmx_zbar_image_destroy;
typedef __typeof__(&zbar_image_set_format) lmx_zbar_image_set_format;
typedef __typeof__(&zbar_image_set_size) lmx_zbar_image_set_size;
typedef __typeof__(&zbar_image_set_data) lmx_zbar_image_set_data;
typedef __typeof__(&zbar_scan_image) lmx_zbar_scan_image;
typedef __typeof__(&zbar_image_first_symbol) lmx_zbar_image_first_symbol;
typedef __typeof__(&zbar_symbol_get_data) lmx_zbar_symbol_get_data;
typedef __typeof__(&zbar_symbol_get_data_length) lmx_zbar_symbol_get_data_length;
typedef __typeof__(&zbar_symbol_next) lmx_zbar_symbol_next;
