import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The one way this layer makes a system call that can fail: `errno` is read right after the
/// call (before anything else can change it), and a call interrupted by a signal (`EINTR`) is
/// made again.
enum SystemCall {
    /// `body`'s result when it is not negative, else the `errno` it set.
    @inline(__always)
    static func retrying<Value: SignedInteger>(_ body: () -> Value) -> Result<Value, Errno> {
        while true {
            let value = body()
            if value >= 0 { return .success(value) }
            let code = errno
            if code != EINTR { return .failure(Errno(rawValue: code)) }
        }
    }
}
