#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The keys a config file may have, from the settings' own coding keys, and those it has that no
/// setting has: a misspelt key (`stabilty_window`) is otherwise ignored without a word, and its
/// default stays in force.
public enum ConfigurationKeys {
    /// At most this many unknown keys are reported.
    public static let maxReported = 32

    /// The keys of `bytes` (JSON5) that no setting has, as paths: `health.stabilty_window`,
    /// `endpoints[1].urll`, `gatway`. Empty when there are none or the file is not JSON (its
    /// decoding reports that).
    public static func unknown(in bytes: [UInt8]) -> [String] {
        let decoder = JSONDecoder()
        decoder.allowsJSON5 = true
        guard let tree = try? decoder.decode(Tree.self, from: Data(bytes)) else { return [] }
        var found: [String] = []
        check(tree, against: top, path: "", into: &found)
        return found
    }

    /// What an object may hold: its keys, and for some of them what their values may hold.
    struct Shape {
        var keys: Set<String>
        var nested: [String: Shape] = [:]
        /// Keys whose value is an array of objects of this shape.
        var items: [String: Shape] = [:]
    }

    static let top = Shape(
        keys: Set(AgentConfiguration.CodingKeys.allCases.map(\.rawValue)),
        nested: [
            "health": Shape(keys: Set(HealthPolicy.CodingKeys.allCases.map(\.rawValue))),
            "gateway": Shape(keys: Set(GatewayConfiguration.CodingKeys.allCases.map(\.rawValue))),
        ],
        items: ["endpoints": Shape(keys: Set(ManualEndpoint.CodingKeys.allCases.map(\.rawValue)))])

    static func check(_ tree: Tree, against shape: Shape, path: String, into found: inout [String]) {
        guard case .object(let members) = tree else { return }
        for (key, value) in members.sorted(by: { $0.key < $1.key }) {
            guard found.count < maxReported else { return }
            let here = path.isEmpty ? key : path + "." + key
            guard shape.keys.contains(key) else {
                found.append(here)
                continue
            }
            if let inner = shape.nested[key] { check(value, against: inner, path: here, into: &found) }
            if let inner = shape.items[key], case .array(let elements) = value {
                for (index, element) in elements.enumerated() {
                    check(element, against: inner, path: "\(here)[\(index)]", into: &found)
                }
            }
        }
    }

    /// A JSON value, as far as keys go.
    enum Tree: Decodable {
        case object([String: Tree])
        case array([Tree])
        case other

        struct Key: CodingKey {
            var stringValue: String
            var intValue: Int? { nil }
            init(stringValue: String) { self.stringValue = stringValue }
            init?(intValue: Int) { nil }
        }

        init(from decoder: any Decoder) throws {
            if let object = try? decoder.container(keyedBy: Key.self) {
                var members: [String: Tree] = [:]
                for key in object.allKeys {
                    members[key.stringValue] = (try? object.decode(Tree.self, forKey: key)) ?? .other
                }
                self = .object(members)
            } else if var array = try? decoder.unkeyedContainer() {
                var elements: [Tree] = []
                while !array.isAtEnd {
                    guard let element = try? array.decode(Tree.self) else { break }
                    elements.append(element)
                }
                self = .array(elements)
            } else {
                self = .other
            }
        }
    }
}
