import LMXCore
import LMXSystem

/// What the user gave `lmx-pair`, read: a file or standard input, an image decoded to its QR
/// code (one chosen among several), or the text itself.
public enum PairingInput {
    public enum Failure: Error, Sendable {
        /// A usage mistake (a code number that is not in the image): exit 64.
        case usage(String)
        /// No pairing can come of it (no code, several codes, an unsupported image): exit 65.
        case invalid(String)
        /// The file cannot be read: exit 66.
        case unreadable(String)

        public var message: String {
            switch self {
            case .usage(let m), .invalid(let m), .unreadable(let m): m
            }
        }

        public var exitCode: Int32 {
            switch self {
            case .usage: ExitStatus.usage.rawValue
            case .invalid: ExitStatus.invalidInput.rawValue
            case .unreadable: ExitStatus.noInput.rawValue
            }
        }
    }

    /// Reads a whole file, or standard input for `-` (at most the image limit).
    public static func readBytes(_ file: String, name: String) throws(Failure) -> [UInt8] {
        let bytes: [UInt8]
        do {
            bytes = try FileSystem.read(file, limit: ImageLimits.maxFileBytes)
        } catch {
            switch error {
            case .missing: throw .unreadable("\(name): no such file")
            case .unreadable(let why): throw .unreadable("\(name): \(why)")
            case .tooLarge(let size): throw .invalid("\(name): \(ImageError.fileTooLarge(bytes: size).description)")
            }
        }
        if bytes.isEmpty { throw .invalid("\(name): empty: no pairing code or link in it") }
        return bytes
    }

    /// The payload of bytes already read: an image's QR code (`code` chooses among several,
    /// counting from 1), or the text itself.
    public static func payload(_ bytes: [UInt8], name: String, code: Int?) throws(Failure) -> (
        name: String, bytes: [UInt8]
    ) {
        switch ImageDecoder.kind(of: bytes) {
        case .text:
            return (name, bytes)
        case .otherImage(let format):
            throw .invalid("\(name): \(ImageError.unsupported(format).description)")
        case .png, .jpeg:
            let image: GrayImage
            do { image = try ImageDecoder.decode(bytes) } catch { throw .invalid("\(name): \(error.description)") }
            let codes: [[UInt8]]
            do { codes = try QRScanner.scan(image) } catch { throw .invalid("\(name): \(error.description)") }
            if codes.isEmpty {
                throw .invalid(
                    "\(name): no QR code found in the \(image.width) × \(image.height) image; photograph the code straight on, filling most of the picture, or use the text of the link"
                )
            }
            if let code {
                guard code <= codes.count else {
                    throw .usage(
                        "\(name) holds \(codes.count) QR code\(codes.count == 1 ? "" : "s"); --code \(code) is not one of them"
                    )
                }
                return ("\(name) (code \(code))", codes[code - 1])
            }
            guard codes.count == 1 else {
                let parser = PairingParser(allowInsecure: true, now: SystemClock.unixTime())
                let listed = codes.enumerated().map { i, bytes in
                    let what = (try? parser.parse(bytes))?.first.map { pairing in
                        "\(pairing.format.rawValue): \(pairing.label)\(pairing.wan.map { " \($0.url)" } ?? "")\(pairing.lan.map { " lan \($0)" } ?? "")"
                    }
                    return "  \(i + 1)  \(what ?? "not a pairing code")"
                }
                throw .invalid(
                    (["\(name) holds \(codes.count) QR codes; nothing imported. Choose one with --code N:"] + listed)
                        .joined(separator: "\n"))
            }
            return (name, codes[0])
        }
    }
}
