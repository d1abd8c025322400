#include <qrencode.h>

/* libqrencode is opened on first use, not linked (see CZBar/shim.h). */
typedef __typeof__(&QRcode_encodeString8bit) lmx_QRcode_encodeString8bit;
typedef __typeof__(&QRcode_free) lmx_QRcode_free;
