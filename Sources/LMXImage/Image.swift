import CPNG
import CTurboJPEG

/// 8-bit grey pixels, one byte per pixel, rows packed (zbar's `Y800`).
public struct GrayImage: Sendable {
    public var width: Int
    public var height: Int
    public var pixels: [UInt8]

    public init(width: Int, height: Int, pixels: [UInt8]) {
        self.width = width
        self.height = height
        self.pixels = pixels
    }
}

/// What kind of file the bytes are, by their first bytes.
public enum FileKind: Sendable, Equatable {
    case png, jpeg
    /// An image format that is not read (GIF, WebP, BMP, TIFF, HEIC…).
    case otherImage(String)
    /// Anything else: read as text.
    case text
}

public enum ImageError: Error, Sendable, Equatable, CustomStringConvertible {
    case tooManyPixels(width: Int, height: Int)
    case fileTooLarge(bytes: Int)
    case corrupt(format: String, detail: String)
    case unsupported(String)
    case libraryMissing(library: String, package: String, detail: String)

    public var description: String {
        switch self {
        case .tooManyPixels(let w, let h):
            "the image is \(w) × \(h) pixels (over \(ImageLimits.maxPixels / 1_000_000) megapixels): refused before decoding; crop or scale it down around the code"
        case .fileTooLarge(let bytes):
            "the file is \(bytes / (1024 * 1024)) MiB (over \(ImageLimits.maxFileBytes / (1024 * 1024)) MiB): refused; crop or scale it down around the code"
        case .corrupt(let format, let detail):
            "not a readable \(format) image (\(detail)): the file is truncated or damaged; export or photograph the code again"
        case .unsupported(let name):
            "\(name) images are not read: save the code as PNG or JPEG"
        case .libraryMissing(let library, let package, let detail):
            "images need \(library), which could not be loaded (\(detail)): install the package \(package), or give the pairing as text"
        }
    }
}

public enum ImageLimits {
    /// Images above this are refused from their header, before any pixel is decoded.
    public static let maxPixels = 50_000_000
    /// Files above this are refused before they are read.
    public static let maxFileBytes = 32 * 1024 * 1024
}

public enum ImageDecoder {
    public static func kind(of bytes: [UInt8]) -> FileKind {
        func starts(_ magic: [UInt8], at offset: Int = 0) -> Bool {
            bytes.count >= offset + magic.count && Array(bytes[offset..<offset + magic.count]) == magic
        }
        if starts([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]) { return .png }
        if starts([0xFF, 0xD8, 0xFF]) { return .jpeg }
        if starts(Array("GIF8".utf8)) { return .otherImage("GIF") }
        if starts(Array("RIFF".utf8)) && starts(Array("WEBP".utf8), at: 8) { return .otherImage("WebP") }
        if starts(Array("BM".utf8)) && bytes.count > 26 && bytes[6...9].allSatisfy({ $0 == 0 }) {
            return .otherImage("BMP")
        }
        if starts([0x49, 0x49, 0x2A, 0x00]) || starts([0x4D, 0x4D, 0x00, 0x2A]) { return .otherImage("TIFF") }
        if starts(Array("ftyp".utf8), at: 4) { return .otherImage("HEIC/AVIF") }
        if starts([0xFF, 0x0A]) || starts([0x00, 0x00, 0x00, 0x0C, 0x4A, 0x58, 0x4C, 0x20]) {
            return .otherImage("JPEG XL")
        }
        return .text
    }

    /// Decodes a PNG or JPEG to grey. The size is checked from the header first.
    public static func decode(_ bytes: [UInt8]) throws(ImageError) -> GrayImage {
        switch kind(of: bytes) {
        case .png: return try decodePNG(bytes)
        case .jpeg: return try decodeJPEG(bytes)
        case .otherImage(let name): throw .unsupported(name)
        case .text: throw .unsupported("Non-image")
        }
    }

    static func checkSize(width: Int, height: Int) throws(ImageError) {
        guard width > 0, height > 0 else { throw .corrupt(format: "image", detail: "zero size") }
        guard width.multipliedReportingOverflow(by: height).partialValue <= ImageLimits.maxPixels,
            width <= ImageLimits.maxPixels, height <= ImageLimits.maxPixels
        else { throw .tooManyPixels(width: width, height: height) }
    }

    /// libpng's simplified API: any bit depth, palette, grey or colour, alpha (laid over white),
    /// interlaced; errors come back as a message, not a long jump.
    static func decodePNG(_ bytes: [UInt8]) throws(ImageError) -> GrayImage {
        // The size first, straight from IHDR (always the first chunk), before libpng reads on.
        if bytes.count >= 24, Array(bytes[12..<16]) == Array("IHDR".utf8) {
            func be(_ at: Int) -> Int { bytes[at..<at + 4].reduce(0) { $0 << 8 | Int($1) } }
            try checkSize(width: be(16), height: be(20))
        }
        let png = try ImageLibraries.png.get()
        var image = png_image()
        image.version = png_uint_32(PNG_IMAGE_VERSION)
        let begun = bytes.withUnsafeBytes { raw in
            png.png_image_begin_read_from_memory(&image, raw.baseAddress, raw.count)
        }
        guard begun != 0 else {
            throw .corrupt(format: "PNG", detail: message(of: &image))
        }
        defer { png.png_image_free(&image) }
        try checkSize(width: Int(image.width), height: Int(image.height))
        image.format = png_uint_32(PNG_FORMAT_GRAY)
        let width = Int(image.width)
        let height = Int(image.height)
        var pixels = [UInt8](repeating: 255, count: width * height)
        var white = png_color(red: 255, green: 255, blue: 255)
        let finished = pixels.withUnsafeMutableBytes { out in
            png.png_image_finish_read(&image, &white, out.baseAddress, png_int_32(width), nil)
        }
        guard finished != 0 else {
            throw .corrupt(format: "PNG", detail: message(of: &image))
        }
        return GrayImage(width: width, height: height, pixels: pixels)
    }

    private static func message(of image: inout png_image) -> String {
        withUnsafeBytes(of: &image.message) { raw in
            let bytes = raw.prefix { $0 != 0 }
            return String(decoding: bytes, as: UTF8.self)
        }
    }

    /// libjpeg-turbo's TurboJPEG API: baseline and progressive, any colour space, straight to
    /// grey; errors come back as a status, not a long jump.
    static func decodeJPEG(_ bytes: [UInt8]) throws(ImageError) -> GrayImage {
        let tj = try ImageLibraries.turboJPEG.get()
        guard let handle = tj.tjInitDecompress() else {
            throw .corrupt(format: "JPEG", detail: "no decoder")
        }
        defer { _ = tj.tjDestroy(handle) }
        var width: Int32 = 0
        var height: Int32 = 0
        var subsampling: Int32 = 0
        var colorspace: Int32 = 0
        let header = bytes.withUnsafeBufferPointer { buffer in
            tj.tjDecompressHeader3(
                handle, buffer.baseAddress, UInt(buffer.count), &width, &height, &subsampling, &colorspace)
        }
        guard header == 0 else {
            throw .corrupt(
                format: "JPEG", detail: tj.tjGetErrorStr2(handle).map { String(cString: $0) } ?? "unknown error")
        }
        try checkSize(width: Int(width), height: Int(height))
        var pixels = [UInt8](repeating: 255, count: Int(width) * Int(height))
        let status = bytes.withUnsafeBufferPointer { buffer in
            pixels.withUnsafeMutableBufferPointer { out in
                tj.tjDecompress2(
                    handle, buffer.baseAddress, UInt(buffer.count), out.baseAddress, width, width, height,
                    Int32(TJPF_GRAY.rawValue), Int32(TJFLAG_ACCURATEDCT))
            }
        }
        if status != 0 {
            // A warning (a few missing bytes at the end) still leaves a usable image; an error
            // does not.
            guard tj.tjGetErrorCode(handle) == Int32(TJERR_WARNING.rawValue) else {
                throw .corrupt(
                    format: "JPEG", detail: tj.tjGetErrorStr2(handle).map { String(cString: $0) } ?? "unknown error")
            }
        }
        return GrayImage(width: Int(width), height: Int(height), pixels: pixels)
    }
}
