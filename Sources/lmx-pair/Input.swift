import LMXCore
import LMXImage

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Glibc)
import Glibc
#endif

/// One input's payload: the decoded QR code, or the text of the file.
struct Payload {
    var name: String
    var bytes: [UInt8]
}

enum PayloadReader {
    /// Reads FILE (or `-`): an image gives its QR code, anything else is text.
    static func read(_ file: String, code: Int?) throws -> Payload {
        let name = file == "-" ? "standard input" : file
        return try payload(readBytes(file, name: name), name: name, code: code)
    }

    /// The payload of bytes already read: an image's QR code, or the text itself.
    static func payload(_ bytes: [UInt8], name: String, code: Int?) throws -> Payload {
        switch ImageDecoder.kind(of: bytes) {
        case .text:
            return Payload(name: name, bytes: bytes)
        case .otherImage(let format):
            throw Failure.invalid("\(name): \(ImageError.unsupported(format).description)")
        case .png, .jpeg:
            let image: GrayImage
            do { image = try ImageDecoder.decode(bytes) } catch {
                throw Failure.invalid("\(name): \(error.description)")
            }
            let codes = QRScanner.scan(image)
            if codes.isEmpty {
                throw Failure.invalid(
                    "\(name): no QR code found in the \(image.width) × \(image.height) image; photograph the code straight on, filling most of the picture, or use the text of the link")
            }
            if let code {
                guard code <= codes.count else {
                    throw Failure.usage("\(name) holds \(codes.count) QR code\(codes.count == 1 ? "" : "s"); --code \(code) is not one of them")
                }
                return Payload(name: "\(name) (code \(code))", bytes: codes[code - 1])
            }
            if codes.count > 1 {
                var lines = ["\(name) holds \(codes.count) QR codes; nothing imported. Choose one with --code N:"]
                let parser = PairingParser(allowInsecure: true, now: Int64(time(nil)))
                for (i, bytes) in codes.enumerated() {
                    let what: String
                    if let pairing = (try? parser.parse(bytes))?.first {
                        what = "\(pairing.format.rawValue): \(pairing.label)\(pairing.wan.map { " \($0.url)" } ?? "")\(pairing.lan.map { " lan \($0)" } ?? "")"
                    } else {
                        what = "not a pairing code"
                    }
                    lines.append("  \(i + 1)  \(what)")
                }
                throw Failure.invalid(lines.joined(separator: "\n"))
            }
            return Payload(name: name, bytes: codes[0])
        }
    }

    /// Reads a whole file (at most the image limit + 1 byte, so a huge file costs nothing).
    static func readBytes(_ file: String, name: String) throws -> [UInt8] {
        let fd: Int32
        if file == "-" {
            fd = STDIN_FILENO
        } else {
            fd = open(file, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else {
                let code = errno
                let why = code == ENOENT ? "no such file" : code == EACCES ? "permission denied" : String(cString: strerror(code))
                throw Failure.unreadable("\(name): \(why)")
            }
        }
        defer { if fd != STDIN_FILENO { close(fd) } }
        var info = stat()
        if fstat(fd, &info) == 0 {
            if (info.st_mode & S_IFMT) == S_IFDIR { throw Failure.unreadable("\(name): is a directory") }
            if (info.st_mode & S_IFMT) == S_IFREG && Int(info.st_size) > ImageLimits.maxFileBytes {
                throw Failure.invalid("\(name): \(ImageError.fileTooLarge(bytes: Int(info.st_size)).description)")
            }
        }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = Glibc.read(fd, &chunk, chunk.count)
            if n < 0 {
                if errno == EINTR { continue }
                throw Failure.unreadable("\(name): \(String(cString: strerror(errno)))")
            }
            if n == 0 { break }
            bytes += chunk[0..<n]
            if bytes.count > ImageLimits.maxFileBytes {
                throw Failure.invalid("\(name): \(ImageError.fileTooLarge(bytes: bytes.count).description)")
            }
        }
        if bytes.isEmpty { throw Failure.invalid("\(name): empty: no pairing code or link in it") }
        return bytes
    }
}

/// Human output for pairings: secrets as "set", never their values.
enum Describe {
    static func pairing(_ p: PairingSummary, verb: String?) -> String {
        var lines: [String] = []
        let title = [verb, p.id, p.name.map { "\"\($0)\"" }, "(\(p.format.rawValue))"].compactMap { $0 }.joined(separator: " ")
        lines.append(title)
        if let url = p.url {
            let route = p.routes?.first { $0.via == .wan }
            lines.append("  tunnel    \(url)\(route.map { "  \(verdict($0))" } ?? "")")
            let secrets = ["admin_key": "admin key", "api_key": "api key", "cf_access": "access token"]
            let shown = ["admin_key", "api_key", "cf_access"].map { "\(secrets[$0]!): \(p.secrets.contains($0) ? "set" : "not set")" }
            lines.append("  secrets   \(shown.joined(separator: ", "))")
        }
        if let lan = p.lan {
            let route = p.routes?.first { $0.via == .lan }
            lines.append("  lan       http://\(lan)\(route.map { "  \(verdict($0))" } ?? "")")
        }
        if let instance = p.instance { lines.append("  instance  \(instance)") }
        if let expires = p.expiresAt { lines.append("  expires   \(expires)") }
        return lines.joined(separator: "\n")
    }

    static func verdict(_ route: PairingRouteState) -> String {
        guard let verdict = route.verdict else { return "[not probed yet]" }
        var text = "[\(verdict.rawValue)\(route.active ? ", active" : "")]"
        if let detail = route.detail, verdict != .ready { text += " \(detail)" }
        return text
    }
}

enum Output {
    static func out(_ line: String) { write(line + "\n", to: STDOUT_FILENO) }
    static func error(_ line: String) { write(line + "\n", to: STDERR_FILENO) }

    static func json<T: Encodable>(_ value: T) {
        let encoder = StatusAPI.encoder
        encoder.outputFormatting.insert(.prettyPrinted)
        out(String(decoding: (try? encoder.encode(value)) ?? Data("null".utf8), as: UTF8.self))
    }

    private static func write(_ text: String, to fd: Int32) {
        var text = text
        text.withUTF8 { buffer in
            var offset = 0
            while offset < buffer.count {
                let written = Glibc.write(fd, buffer.baseAddress! + offset, buffer.count - offset)
                if written < 0 && errno == EINTR { continue }
                guard written > 0 else { return }
                offset += written
            }
        }
    }
}

/// Writes a file readable by its owner only, atomically (a temporary file, then rename).
enum PrivateFile {
    static func write(_ bytes: [UInt8], to path: String) throws {
        let temporary = "\(path).tmp-\(getpid())"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw Failure.unreadable("cannot write \(path): \(String(cString: strerror(errno)))")
        }
        var offset = 0
        var failed = false
        bytes.withUnsafeBytes { raw in
            while offset < raw.count {
                let n = Glibc.write(fd, raw.baseAddress! + offset, raw.count - offset)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { failed = true; return }
                offset += n
            }
        }
        fchmod(fd, 0o600)
        if fsync(fd) != 0 { failed = true }
        close(fd)
        guard !failed, rename(temporary, path) == 0 else {
            let why = String(cString: strerror(errno))
            unlink(temporary)
            throw Failure.unreadable("cannot write \(path): \(why)")
        }
    }
}
