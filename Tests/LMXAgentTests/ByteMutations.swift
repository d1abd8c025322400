/// A seeded generator of small numbers, and mutations of bytes drawn from an alphabet: what the
/// codec tests build their inputs from (the same seed, the same inputs).
struct ByteMutations {
    var state: UInt64

    /// A number in `0..<bound`.
    mutating func next(_ bound: Int) -> Int {
        state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
        return Int((state >> 33) % UInt64(bound))
    }

    /// `bytes` with one to three bytes replaced, inserted (from `alphabet`) or deleted.
    mutating func mutate(_ bytes: [UInt8], alphabet: [UInt8]) -> [UInt8] {
        var out = bytes
        for _ in 0..<(1 + next(3)) where !out.isEmpty {
            let at = next(out.count)
            switch next(3) {
            case 0: out[at] = alphabet[next(alphabet.count)]
            case 1: out.insert(alphabet[next(alphabet.count)], at: at)
            default: out.remove(at: at)
            }
        }
        return out
    }
}
