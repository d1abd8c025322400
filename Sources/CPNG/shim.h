#include <libpng16/png.h>

/* libpng16 is opened on first use, not linked (see CZBar/shim.h). */
typedef __typeof__(&png_image_begin_read_from_memory) lmx_png_image_begin_read_from_memory;
typedef __typeof__(&png_image_finish_read) lmx_png_image_finish_read;
typedef __typeof__(&png_image_free) lmx_png_image_free;
typedef __typeof__(&png_image_write_to_memory) lmx_png_image_write_to_memory;
