#if canImport(Glibc)
import Glibc
#endif

/// Network interfaces as the kernel numbers them.
public enum NetworkInterface {
    /// The index of the interface named `name` now (`if_nametoindex`), nil when there is none.
    public static func index(named name: String) -> UInt32? {
        let index = if_nametoindex(name)
        return index == 0 ? nil : index
    }
}
