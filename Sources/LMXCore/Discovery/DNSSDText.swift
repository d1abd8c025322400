/// Text forms of DNS-SD data exactly as Avahi's tools print them, so output stays
/// byte-compatible with `avahi-browse -p`.
public enum DNSSDText {
    /// Escapes one DNS label like `avahi_escape_label`: `.` and `\` are backslash-escaped,
    /// letters, digits, `-` and `_` stay, every other byte becomes `\DDD` (decimal).
    public static func escapeLabel(_ label: String) -> String {
        var out = ""
        out.reserveCapacity(label.utf8.count)
        for byte in label.utf8 {
            switch byte {
            case UInt8(ascii: "."), UInt8(ascii: "\\"):
                out.append("\\")
                out.unicodeScalars.append(Unicode.Scalar(byte))
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                out.append(decimalEscape(byte))
            }
        }
        return out
    }

    /// Reverses ``escapeLabel(_:)`` (and accepts any `\X` as a literal `X`).
    public static func unescapeLabel(_ escaped: String) -> String {
        var bytes: [UInt8] = []
        var input = Array(escaped.utf8)[...]
        while let byte = input.popFirst() {
            guard byte == UInt8(ascii: "\\"), let next = input.first else {
                bytes.append(byte)
                continue
            }
            let digits = input.prefix(3)
            if digits.count == 3, digits.allSatisfy({ (48...57).contains($0) }),
                let value = UInt8(String(decoding: digits, as: UTF8.self))
            {
                bytes.append(value)
                input = input.dropFirst(3)
            } else {
                bytes.append(next)
                input = input.dropFirst()
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// One TXT entry as `avahi_string_list_to_string` prints it: in double quotes, `"` and `\`
    /// backslash-escaped, bytes below 32 or above 127 as `\DDD`.
    public static func quoteTXTEntry(_ entry: [UInt8]) -> String {
        var out = "\""
        for byte in entry {
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"):
                out.append("\\")
                out.unicodeScalars.append(Unicode.Scalar(byte))
            case 32...127:
                out.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                out.append(decimalEscape(byte))
            }
        }
        out.append("\"")
        return out
    }

    /// A whole TXT record as `avahi-browse -p` prints it: `avahi_string_list_to_string` prints
    /// the entries in reverse wire order, so do we.
    public static func quoteTXT(_ txt: TXTRecord) -> String {
        txt.entries.reversed().map(quoteTXTEntry).joined(separator: " ")
    }

    private static func decimalEscape(_ byte: UInt8) -> String {
        let digits = String(byte)
        return "\\" + String(repeating: "0", count: 3 - digits.count) + digits
    }
}
