#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

extension Character {
    var isASCIIDigit: Bool { isASCII && isNumber }
}

extension Optional where Wrapped == String {
    var nonBlank: String? {
        guard let value = self, !value.isEmpty else { return nil }
        return value
    }
}

extension String {
    func trimmingASCIIWhitespace() -> String {
        let scalars = unicodeScalars
        guard let start = scalars.firstIndex(where: { !Self.isSpace($0) }) else { return "" }
        let end = scalars.lastIndex(where: { !Self.isSpace($0) })!
        return String(scalars[start...end])
    }

    private static func isSpace(_ s: Unicode.Scalar) -> Bool {
        s == " " || s == "\t" || s == "\n" || s == "\r" || s == "\u{0B}" || s == "\u{0C}"
    }
}
