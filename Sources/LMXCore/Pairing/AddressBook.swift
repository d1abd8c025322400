#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// `lmx-connections.json`, as the Opta desktop manager writes it (camelCase or snake_case).
struct AddressBook: Decodable {
    struct Entry: Decodable {
        var id: String?
        var label: String?
        var host: String?
        var port: Int?
        var tunnel: String?

        enum Keys: String, CodingKey {
            case id, label, host, port, tunnelUrl, tunnel_url
        }

        init(from decoder: any Decoder) throws {
            let c = try decoder.container(keyedBy: Keys.self)
            id = try? c.decodeIfPresent(String.self, forKey: .id)
            label = try c.decodeIfPresent(String.self, forKey: .label)
            host = try c.decodeIfPresent(String.self, forKey: .host)
            if let number = try? c.decodeIfPresent(Int.self, forKey: .port) {
                port = number
            } else if let text = try? c.decodeIfPresent(String.self, forKey: .port) {
                guard let number = Int(text) else {
                    throw DecodingError.dataCorruptedError(forKey: .port, in: c, debugDescription: "not a port number")
                }
                port = number
            } else if c.contains(.port), try !c.decodeNil(forKey: .port) {
                throw DecodingError.dataCorruptedError(forKey: .port, in: c, debugDescription: "not a port number")
            }
            tunnel =
                try c.decodeIfPresent(String.self, forKey: .tunnelUrl)
                ?? c.decodeIfPresent(String.self, forKey: .tunnel_url)
        }
    }

    var entries: [Entry]
}
