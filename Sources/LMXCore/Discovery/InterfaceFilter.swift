/// Chooses the network interfaces whose mDNS results count, by name with shell-style globs
/// (`*`, `?`, `[abc]`, `[a-z]`, `[!x]`).
///
/// Explicit exclusions always apply. With include patterns only matching interfaces count,
/// even ones the default exclusions would leave out (naming one is an explicit choice). With
/// none, every interface counts except container, VM and VPN links, unless
/// ``excludesVirtualInterfaces`` is off.
public struct InterfaceFilter: Sendable, Hashable {
    /// Left out unless asked for: container bridges, veth pairs, VM and VPN links.
    public static let defaultExclusions = ["docker*", "veth*", "br-*", "virbr*", "tun*", "tap*"]

    public var include: [String]
    public var exclude: [String]
    public var excludesVirtualInterfaces: Bool

    public init(include: [String] = [], exclude: [String] = [], excludesVirtualInterfaces: Bool = true) {
        self.include = include
        self.exclude = exclude
        self.excludesVirtualInterfaces = excludesVirtualInterfaces
    }

    /// Every interface counts.
    public static let all = InterfaceFilter(excludesVirtualInterfaces: false)

    public func allows(_ interfaceName: String) -> Bool {
        if exclude.contains(where: { Glob.matches($0, interfaceName) }) { return false }
        if !include.isEmpty { return include.contains { Glob.matches($0, interfaceName) } }
        return !(excludesVirtualInterfaces && Self.defaultExclusions.contains { Glob.matches($0, interfaceName) })
    }
}

/// Minimal shell glob matching over Unicode scalars, with no C dependency.
public enum Glob {
    public static func matches(_ pattern: String, _ text: String) -> Bool {
        match(Array(pattern.unicodeScalars)[...], Array(text.unicodeScalars)[...])
    }

    private static func match(_ pattern: ArraySlice<Unicode.Scalar>, _ text: ArraySlice<Unicode.Scalar>) -> Bool {
        var p = pattern
        var t = text
        while let c = p.first {
            switch c {
            case "*":
                let rest = p.dropFirst()
                if rest.isEmpty { return true }
                var suffix = t
                while true {
                    if match(rest, suffix) { return true }
                    if suffix.isEmpty { return false }
                    suffix = suffix.dropFirst()
                }
            case "?":
                guard !t.isEmpty else { return false }
                p = p.dropFirst()
                t = t.dropFirst()
            case "[":
                guard let ch = t.first, let (matched, rest) = matchClass(p.dropFirst(), ch) else {
                    // An unterminated class matches a literal "[".
                    if t.first == "[" && !p.dropFirst().contains("]") {
                        p = p.dropFirst()
                        t = t.dropFirst()
                        continue
                    }
                    return false
                }
                guard matched else { return false }
                p = rest
                t = t.dropFirst()
            default:
                guard t.first == c else { return false }
                p = p.dropFirst()
                t = t.dropFirst()
            }
        }
        return t.isEmpty
    }

    /// Matches `ch` against the class after `[`; returns the pattern after `]`.
    private static func matchClass(_ body: ArraySlice<Unicode.Scalar>, _ ch: Unicode.Scalar)
        -> (Bool, ArraySlice<Unicode.Scalar>)?
    {
        var rest = body
        var negate = false
        if let first = rest.first, first == "!" || first == "^" {
            negate = true
            rest = rest.dropFirst()
        }
        var matched = false
        var firstItem = true
        while let c = rest.first {
            if c == "]" && !firstItem {
                return (matched != negate, rest.dropFirst())
            }
            firstItem = false
            rest = rest.dropFirst()
            if rest.count >= 2, rest.first == "-", let upper = rest.dropFirst().first, upper != "]" {
                if c.value <= ch.value && ch.value <= upper.value { matched = true }
                rest = rest.dropFirst(2)
            } else if c == ch {
                matched = true
            }
        }
        return nil
    }
}
