#if canImport(Glibc)
import Glibc
#endif

/// A C library opened at run time (dlopen) rather than linked: for libraries only one command
/// uses, so that the others, which share the multi-call binary, never map them.
public final class SharedLibrary: @unchecked Sendable {
    // @unchecked: the handle is only read after init; dlsym is thread-safe.
    private let handle: UnsafeMutableRawPointer
    public let name: String

    /// Opens `name` (a soname such as "libzbar.so.0", found as the dynamic linker finds
    /// libraries); the error is dlerror's text.
    public init(_ name: String) throws(SharedLibraryError) {
        guard let handle = dlopen(name, RTLD_NOW | RTLD_LOCAL) else {
            throw SharedLibraryError(library: name, detail: dlerror().map { String(cString: $0) } ?? "not found")
        }
        self.handle = handle
        self.name = name
    }

    /// The function `symbol` as `type` (by default the type the result is stored as), a C
    /// function pointer type taken from the library's header (`typedef __typeof__(&function)
    /// name;` in the module map's shim).
    public func function<T>(_ symbol: String, as type: T.Type = T.self) throws(SharedLibraryError) -> T {
        guard MemoryLayout<T>.size == MemoryLayout<UnsafeMutableRawPointer>.size, let address = dlsym(handle, symbol)
        else {
            throw SharedLibraryError(library: name, detail: "no function \(symbol)")
        }
        return unsafeBitCast(address, to: T.self)
    }
}

public struct SharedLibraryError: Error, Sendable, Equatable, CustomStringConvertible {
    public let library: String
    public let detail: String

    public var description: String { "\(library) could not be loaded: \(detail)" }
}
