import CPNG
import CQRencode
import CTurboJPEG
import CZBar
import LMXSystem

/// libzbar, libpng16, libturbojpeg and libqrencode, opened the first time lmx-pair reads or
/// draws an image instead of linked: lmx-agentd shares the multi-call binary and so never maps
/// them, nor the X11, xcb and v4l libraries libzbar brings (about 1 MiB of its memory, and code
/// a network-facing daemon has no use for). The functions' types come from the headers.
enum ImageLibraries {
    struct ZBar {
        let zbar_image_scanner_create: lmx_zbar_image_scanner_create
        let zbar_image_scanner_destroy: lmx_zbar_image_scanner_destroy
        let zbar_image_scanner_set_config: lmx_zbar_image_scanner_set_config
        let zbar_image_create: lmx_zbar_image_create
        let zbar_image_destroy: lmx_zbar_image_destroy
        let zbar_image_set_format: lmx_zbar_image_set_format
        let zbar_image_set_size: lmx_zbar_image_set_size
        let zbar_image_set_data: lmx_zbar_image_set_data
        let zbar_scan_image: lmx_zbar_scan_image
        let zbar_image_first_symbol: lmx_zbar_image_first_symbol
        let zbar_symbol_get_data: lmx_zbar_symbol_get_data
        let zbar_symbol_get_data_length: lmx_zbar_symbol_get_data_length
        let zbar_symbol_next: lmx_zbar_symbol_next

        init(_ l: SharedLibrary) throws(SharedLibraryError) {
            zbar_image_scanner_create = try l.function("zbar_image_scanner_create")
            zbar_image_scanner_destroy = try l.function("zbar_image_scanner_destroy")
            zbar_image_scanner_set_config = try l.function("zbar_image_scanner_set_config")
            zbar_image_create = try l.function("zbar_image_create")
            zbar_image_destroy = try l.function("zbar_image_destroy")
            zbar_image_set_format = try l.function("zbar_image_set_format")
            zbar_image_set_size = try l.function("zbar_image_set_size")
            zbar_image_set_data = try l.function("zbar_image_set_data")
            zbar_scan_image = try l.function("zbar_scan_image")
            zbar_image_first_symbol = try l.function("zbar_image_first_symbol")
            zbar_symbol_get_data = try l.function("zbar_symbol_get_data")
            zbar_symbol_get_data_length = try l.function("zbar_symbol_get_data_length")
            zbar_symbol_next = try l.function("zbar_symbol_next")
        }
    }

    struct PNG {
        let png_image_begin_read_from_memory: lmx_png_image_begin_read_from_memory
        let png_image_finish_read: lmx_png_image_finish_read
        let png_image_free: lmx_png_image_free
        let png_image_write_to_memory: lmx_png_image_write_to_memory

        init(_ l: SharedLibrary) throws(SharedLibraryError) {
            png_image_begin_read_from_memory = try l.function("png_image_begin_read_from_memory")
            png_image_finish_read = try l.function("png_image_finish_read")
            png_image_free = try l.function("png_image_free")
            png_image_write_to_memory = try l.function("png_image_write_to_memory")
        }
    }

    struct TurboJPEG {
        let tjInitDecompress: lmx_tjInitDecompress
        let tjDestroy: lmx_tjDestroy
        let tjDecompressHeader3: lmx_tjDecompressHeader3
        let tjDecompress2: lmx_tjDecompress2
        let tjGetErrorStr2: lmx_tjGetErrorStr2
        let tjGetErrorCode: lmx_tjGetErrorCode

        init(_ l: SharedLibrary) throws(SharedLibraryError) {
            tjInitDecompress = try l.function("tjInitDecompress")
            tjDestroy = try l.function("tjDestroy")
            tjDecompressHeader3 = try l.function("tjDecompressHeader3")
            tjDecompress2 = try l.function("tjDecompress2")
            tjGetErrorStr2 = try l.function("tjGetErrorStr2")
            tjGetErrorCode = try l.function("tjGetErrorCode")
        }
    }

    struct QRencode {
        let QRcode_encodeString8bit: lmx_QRcode_encodeString8bit
        let QRcode_free: lmx_QRcode_free

        init(_ l: SharedLibrary) throws(SharedLibraryError) {
            QRcode_encodeString8bit = try l.function("QRcode_encodeString8bit")
            QRcode_free = try l.function("QRcode_free")
        }
    }

    // Each opened once, on first use (Swift's lazy globals); a failure is kept and reported each
    // time, naming the Debian package that holds the library.
    static let zbar = Result<ZBar, ImageError> { () throws(ImageError) in
        try open("libzbar.so.0", "libzbar0", ZBar.init)
    }
    static let png = Result<PNG, ImageError> { () throws(ImageError) in
        try open("libpng16.so.16", "libpng16-16", PNG.init)
    }
    static let turboJPEG = Result<TurboJPEG, ImageError> { () throws(ImageError) in
        try open("libturbojpeg.so.0", "libturbojpeg0", TurboJPEG.init)
    }
    static let qrencode = Result<QRencode, ImageError> { () throws(ImageError) in
        try open("libqrencode.so.4", "libqrencode4", QRencode.init)
    }

    private static func open<T>(
        _ soname: String, _ package: String, _ make: (SharedLibrary) throws(SharedLibraryError) -> T
    ) throws(ImageError) -> T {
        do {
            return try make(try SharedLibrary(soname))
        } catch {
            throw .libraryMissing(library: soname, package: package, detail: error.detail)
        }
    }
}
