/// Why a payload is not a usable pairing. Messages name the field and what to do; they quote
/// only values that are not secret (a host, a port, a version), shortened and escaped.
public struct PairingError: Error, Sendable, Hashable, CustomStringConvertible {
    public enum Kind: String, Sendable, Hashable {
        case empty, notText, unknownFormat, unsupportedVersion, missingField, invalidField
        case duplicateField, tooLong, controlCharacter, insecure, expired, malformed
    }

    public var kind: Kind
    /// The offending field (`url`, `lan`, `entries[2].port`), if one is to blame.
    public var field: String?
    public var message: String

    public init(_ kind: Kind, field: String? = nil, _ message: String) {
        self.kind = kind
        self.field = field
        self.message = message
    }

    public var description: String {
        if let field { return "\(field): \(message)" }
        return message
    }

    /// A non-secret value, safe to show: control characters escaped, at most 64 characters.
    static func quote(_ value: some StringProtocol) -> String {
        var out = ""
        for scalar in value.unicodeScalars.prefix(64) {
            if scalar.value < 0x20 || scalar.value == 0x7F {
                out += "\\u{\(String(scalar.value, radix: 16))}"
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        if value.unicodeScalars.count > 64 { out += "…" }
        return "'\(out)'"
    }
}
