#if canImport(Glibc)
import Glibc
#endif

/// The one way this layer makes a system call that can fail: `errno` is read right after the
/// call (before anything else can change it), and a call interrupted by a signal (`EINTR`) is
/// made again.
enum SystemCall {
    /// `body`'s result when it is not negative, else the `errno` it set.
    @inline(__always)
    static func retrying<Value: SignedInteger>(_ body: () -> Value) -> Result<Value, Errno32> {
        while true {
            let value = body()
            if value >= 0 { return .success(value) }
            let code = errno
            if code != EINTR { return .failure(Errno32(code)) }
        }
    }
}

/// An `errno` value as an error.
struct Errno32: Error, Equatable {
    let code: Int32
    init(_ code: Int32) { self.code = code }
}
