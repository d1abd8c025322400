#include <stddef.h>
#include <turbojpeg.h>

/* libturbojpeg is opened on first use, not linked (see CZBar/shim.h). */
typedef __typeof__(&tjInitDecompress) lmx_tjInitDecompress;
typedef __typeof__(&tjDestroy) lmx_tjDestroy;
typedef __typeof__(&tjDecompressHeader3) lmx_tjDecompressHeader3;
typedef __typeof__(&tjDecompress2) lmx_tjDecompress2;
typedef __typeof__(&tjGetErrorStr2) lmx_tjGetErrorStr2;
typedef __typeof__(&tjGetErrorCode) lmx_tjGetErrorCode;
