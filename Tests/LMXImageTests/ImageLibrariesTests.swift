import LMXSystem
import Testing

@testable import LMXImage

/// The image libraries are opened at run time (so lmx-agentd never maps them): they load, their
/// functions work through the typed pointers, and a library that cannot be loaded is an error
/// naming it and the package to install, not a crash.
@Suite("Image libraries opened at run time")
struct ImageLibrariesTests {
    @Test("all four load, and a code drawn by libqrencode and libpng is read back by libpng and zbar")
    func roundTrip() throws {
        _ = try ImageLibraries.zbar.get()
        _ = try ImageLibraries.turboJPEG.get()
        let png = try QREncoder.png(try QREncoder.matrix("lmx://pair?v=1&n=round-trip"), scale: 4)
        let image = try ImageDecoder.decode(png)
        #expect(try QRScanner.scan(image) == [Array("lmx://pair?v=1&n=round-trip".utf8)])
    }

    @Test("a library that is not there: an error with its name, no crash")
    func missing() {
        let failure = #expect(throws: SharedLibraryError.self) { try SharedLibrary("liblmx-no-such-library.so.7") }
        #expect(failure?.description.contains("liblmx-no-such-library.so.7") == true)
        let error = ImageError.libraryMissing(library: "libzbar.so.0", package: "libzbar0", detail: "not found")
        #expect(error.description.contains("libzbar0"))
        #expect(error.description.contains("as text"))
    }

    @Test("a function the library lacks is an error too")
    func missingFunction() throws {
        let libc = try SharedLibrary("libc.so.6")
        typealias GetPID = @convention(c) () -> Int32
        #expect(try libc.function("getpid", as: GetPID.self)() == ProcessLimits.processID)
        #expect(throws: SharedLibraryError.self) { try libc.function("lmx_no_such_function", as: GetPID.self) }
    }
}
