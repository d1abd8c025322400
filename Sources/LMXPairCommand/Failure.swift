import LMXCore
import LMXImage
import LMXSystem

/// A failure with its exit code (64 usage, 65 invalid, 66 unreadable, 69 unavailable).
struct Failure: Error {
    var code: Int32
    var message: String

    static func invalid(_ message: String) -> Failure {
        Failure(code: ExitStatus.invalidInput.rawValue, message: message)
    }
    static func unreadable(_ message: String) -> Failure {
        Failure(code: ExitStatus.noInput.rawValue, message: message)
    }
    static func unavailable(_ message: String) -> Failure {
        Failure(code: ExitStatus.unavailable.rawValue, message: message)
    }

    init(code: Int32, message: String) {
        self.code = code
        self.message = message
    }

    init(_ error: any Error) {
        switch error {
        case let failure as Failure: self = failure
        case let error as PairingBookError: self.init(code: error.exitCode, message: error.description)
        case let error as PairingInput.Failure: self.init(code: error.exitCode, message: error.message)
        default: self = .unavailable("\(error)")
        }
    }
}
