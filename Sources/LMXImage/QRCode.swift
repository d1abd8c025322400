import CPNG
import CQRencode
import CZBar

/// Finds QR codes in grey pixels with zbar (QR only, binary mode: the bytes as encoded).
///
/// What zbar reads by itself, measured with qrencode and ImageMagick images (PairTests): mirrored
/// codes (a front camera's picture), low contrast (grey on grey), no quiet zone, perspective and
/// blur. What it does not, by default: light modules on dark (a code shown in a dark theme, or
/// printed so), which its `ZBAR_CFG_TEST_INVERTED` option reads with a second pass over the
/// inverted image, only when the first pass found nothing.
public enum QRScanner {
    public static func scan(_ image: GrayImage) throws(ImageError) -> [[UInt8]] {
        let z = try ImageLibraries.zbar.get()
        guard let scanner = z.zbar_image_scanner_create() else { return [] }
        defer { z.zbar_image_scanner_destroy(scanner) }
        _ = z.zbar_image_scanner_set_config(scanner, ZBAR_NONE, ZBAR_CFG_ENABLE, 0)
        _ = z.zbar_image_scanner_set_config(scanner, ZBAR_QRCODE, ZBAR_CFG_ENABLE, 1)
        _ = z.zbar_image_scanner_set_config(scanner, ZBAR_QRCODE, ZBAR_CFG_BINARY, 1)
        _ = z.zbar_image_scanner_set_config(scanner, ZBAR_NONE, ZBAR_CFG_TEST_INVERTED, 1)
        guard let zimage = z.zbar_image_create() else { return [] }
        defer { z.zbar_image_destroy(zimage) }
        z.zbar_image_set_format(zimage, lmx_zbar_format_y800())
        z.zbar_image_set_size(zimage, UInt32(image.width), UInt32(image.height))
        var codes: [[UInt8]] = []
        image.pixels.withUnsafeBytes { raw in
            // zbar only reads the pixels during the scan; no cleanup handler, the array owns them.
            z.zbar_image_set_data(zimage, raw.baseAddress, UInt(raw.count), nil)
            guard z.zbar_scan_image(scanner, zimage) > 0 else { return }
            var symbol = z.zbar_image_first_symbol(zimage)
            while let current = symbol {
                if let data = z.zbar_symbol_get_data(current) {
                    let count = Int(z.zbar_symbol_get_data_length(current))
                    codes.append(
                        data.withMemoryRebound(to: UInt8.self, capacity: count) {
                            Array(UnsafeBufferPointer(start: $0, count: count))
                        })
                }
                symbol = z.zbar_symbol_next(current)
            }
            z.zbar_image_set_data(zimage, nil, 0, nil)
        }
        // The same code can be reported twice (zbar's two passes); each distinct payload once.
        var seen = Set<[UInt8]>()
        return codes.filter { seen.insert($0).inserted }
    }
}

/// A QR code as modules: `true` is dark.
public struct QRMatrix: Sendable {
    public var size: Int
    public var modules: [Bool]

    public subscript(x: Int, y: Int) -> Bool {
        guard x >= 0, y >= 0, x < size, y < size else { return false }
        return modules[y * size + x]
    }
}

public enum QREncodeError: Error, CustomStringConvertible {
    case tooLong
    case pngWrite(String)
    case library(String)

    public var description: String {
        switch self {
        case .tooLong: "the pairing is too long for one QR code"
        case .library(let detail): detail
        case .pngWrite(let detail): "could not encode the PNG: \(detail)"
        }
    }
}

public enum QREncoder {
    /// Encodes bytes in 8-bit mode with error correction level M.
    public static func matrix(_ text: String) throws(QREncodeError) -> QRMatrix {
        let qr: ImageLibraries.QRencode
        do { qr = try ImageLibraries.qrencode.get() } catch { throw .library(error.description) }
        let code: UnsafeMutablePointer<QRcode>? = text.withCString { qr.QRcode_encodeString8bit($0, 0, QR_ECLEVEL_M) }
        guard let code else { throw .tooLong }
        defer { qr.QRcode_free(code) }
        let size = Int(code.pointee.width)
        var modules = [Bool](repeating: false, count: size * size)
        for i in 0..<(size * size) { modules[i] = code.pointee.data[i] & 1 == 1 }
        return QRMatrix(size: size, modules: modules)
    }

    /// An 8-bit grey PNG: `scale` pixels per module, a 4-module quiet zone.
    public static func png(_ matrix: QRMatrix, scale: Int = 8) throws(QREncodeError) -> [UInt8] {
        let border = 4
        let side = (matrix.size + 2 * border) * scale
        var pixels = [UInt8](repeating: 255, count: side * side)
        for y in 0..<matrix.size {
            for x in 0..<matrix.size where matrix[x, y] {
                for dy in 0..<scale {
                    let row = ((y + border) * scale + dy) * side
                    for dx in 0..<scale { pixels[row + (x + border) * scale + dx] = 0 }
                }
            }
        }
        let png: ImageLibraries.PNG
        do { png = try ImageLibraries.png.get() } catch { throw .library(error.description) }
        var image = png_image()
        image.version = png_uint_32(PNG_IMAGE_VERSION)
        image.width = png_uint_32(side)
        image.height = png_uint_32(side)
        image.format = png_uint_32(PNG_FORMAT_GRAY)
        var size = 0
        // First call: the size; second: the bytes.
        let sized = pixels.withUnsafeBytes {
            png.png_image_write_to_memory(&image, nil, &size, 0, $0.baseAddress, png_int_32(side), nil)
        }
        guard sized != 0, size > 0 else { throw .pngWrite(pngMessage(&image)) }
        var out = [UInt8](repeating: 0, count: size)
        let written = out.withUnsafeMutableBytes { buffer in
            pixels.withUnsafeBytes {
                png.png_image_write_to_memory(
                    &image, buffer.baseAddress, &size, 0, $0.baseAddress, png_int_32(side), nil)
            }
        }
        guard written != 0 else { throw .pngWrite(pngMessage(&image)) }
        return Array(out.prefix(size))
    }

    /// The code drawn with Unicode half blocks, two module rows per line, light modules as
    /// blocks (for the usual dark terminal), with a quiet zone.
    public static func terminal(_ matrix: QRMatrix) -> String {
        let border = 2
        var out = ""
        var y = -border
        while y < matrix.size + border {
            for x in -border..<(matrix.size + border) {
                let top = !matrix[x, y]
                let bottom = !matrix[x, y + 1]
                out += top && bottom ? "█" : top ? "▀" : bottom ? "▄" : " "
            }
            out += "\n"
            y += 2
        }
        return out
    }

    private static func pngMessage(_ image: inout png_image) -> String {
        withUnsafeBytes(of: &image.message) { raw in String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self) }
    }
}
