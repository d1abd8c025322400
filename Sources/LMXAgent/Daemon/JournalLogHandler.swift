import LMXSystem
import Logging

/// Log lines for the systemd journal: when standard error is the journal's stream
/// (`JOURNAL_STREAM` names its device and inode), each line starts with the sd-daemon priority
/// prefix (`<4>` for a warning) and carries no timestamp of its own (the journal keeps one), so
/// `journalctl -p warning -u lmx-agentd` shows what it should. Elsewhere, swift-log's usual
/// stream handler is used.
public struct JournalLogHandler: LogHandler {
    public var logLevel: Logger.Level = .info
    public var metadata: Logger.Metadata = [:]
    public var metadataProvider: Logger.MetadataProvider?

    /// `label` is swift-log's logger name; the journal already knows the unit, so it is not written.
    public init(label: String) {}

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// True when standard error is connected to the journal (systemd's `JOURNAL_STREAM` check).
    public static func stderrIsJournal(environment: [String: String]) -> Bool {
        StandardStream.errorIsJournal(environment["JOURNAL_STREAM"])
    }

    /// The sd-daemon priority of a level (syslog's: 7 debug … 2 critical).
    public static func priority(_ level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: 7
        case .info: 6
        case .notice: 5
        case .warning: 4
        case .error: 3
        case .critical: 2
        }
    }

    public func log(event: LogEvent) {
        var all = metadata
        if let provided = metadataProvider?.get() { all.merge(provided) { $1 } }
        if let extra = event.metadata { all.merge(extra) { $1 } }
        let fields = all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        // One record per line: a newline inside a message would start a new, unprefixed record.
        let message = "\(event.message)".replacingNewlines
        var line = "<\(Self.priority(event.level))>\(message)"
        if !fields.isEmpty { line += " " + fields.replacingNewlines }
        line += "\n"
        StandardStream.error.write(line)
    }
}

extension String {
    fileprivate var replacingNewlines: String {
        contains("\n") ? split(separator: "\n", omittingEmptySubsequences: false).joined(separator: " ") : self
    }
}
