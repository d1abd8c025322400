import ArgumentParser
import LMXCore
import LMXImage
import LMXStatusClient
import LMXStore

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Glibc)
import Glibc
#endif

@main
struct LMXPair: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lmx-pair",
        abstract: "Pair this machine with an Opta LMX server: import QR codes, links and address books.",
        discussion: """
            lmx-pair pairing.png imports the pairing in a QR code (PNG or JPEG); a text file, a \
            link on standard input (-) or ~/.config/opta/lmx-connections.json work too. Accepted: \
            opta-lmx://pair?v=1&… tokens, https:// tunnel URLs (?key=), dashboard /connect links, \
            account /pair links and Opta address books.

            When lmx-agentd runs, the pairing goes through its socket and is probed at once; \
            otherwise it is saved in the agent's database for its next start.

            Exit codes: 0 done, 64 usage, 65 no valid pairing in the input (no code, bad payload, \
            expired) or no such pairing, 66 file missing or unreadable, 69 agent or database \
            unavailable.
            """,
        version: StatusAPI.version,
        subcommands: [Import.self, List.self, Remove.self, Export.self],
        defaultSubcommand: Import.self)
}

/// Where the agent is: the same defaults and overrides as lmx-agentd.
struct Locations: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp("The agent's database (default: as lmx-agentd; LMX_DB).", valueName: "path"))
    var db: String?

    @Option(name: .long, help: ArgumentHelp("The agent's socket (default: as lmx-agentd; LMX_SOCKET).", valueName: "path"))
    var socket: String?

    var paths: AgentPaths {
        // The caller's user, as it was when lmx-pair started: root keeps root's paths after it
        // has become the agent's user.
        var paths = RuntimeDirectory.clientPaths(uid: Self.invokingUID, environment: ProcessInfo.processInfo.environment).paths
        if let db { paths.database = db }
        if let socket { paths.socket = socket }
        return paths
    }

    var client: StatusClient { StatusClient(socketPath: paths.socket, timeout: 10) }

    /// The effective user id lmx-pair started with (read before any switch of user).
    static let invokingUID: uid_t = geteuid()

    /// Refuses (exit 69) a socket or database in an unsafe `/tmp/lmx-<uid>` (see RuntimeDirectory).
    func validate() throws {
        guard socket == nil || db == nil else { return }
        let uid = geteuid()
        let resolved = RuntimeDirectory.clientPaths(uid: uid, environment: ProcessInfo.processInfo.environment)
        guard let warning = resolved.warning else { return }
        let unsafeSocket = socket == nil && RuntimeDirectory.fallbackContaining(resolved.paths.socket, uid: uid) != nil
        let unsafeDatabase = db == nil && RuntimeDirectory.fallbackContaining(resolved.paths.database, uid: uid) != nil
        guard unsafeSocket || unsafeDatabase else { return }
        Output.error("lmx-pair: \(warning)")
        throw ExitCode(69)
    }

    /// Opens the database for writing (creating it), or fails with 69.
    func openStore() throws -> AgentStore {
        do {
            return try AgentStore.open(path: paths.database) { Output.error("lmx-pair: \($0)") }
        } catch {
            throw Failure.unavailable(
                "cannot open the agent's database \(paths.database): \(error); run as root (sudo) or as the agent's user, or pass --db")
        }
    }

    /// Root working on the database of an agent that runs as another user (the packaged service
    /// runs as `lmx` and owns `/var/lib/lmx`) acts as that user: a file or symbolic link that
    /// user planted there (`agent.db-wal -> /etc/shadow`) can then only reach what that user
    /// may reach, and whatever is created belongs to the agent. Nil: not root, or the directory
    /// is missing or root's own.
    /// - Throws: when the directory is a symbolic link or not a directory (never followed as root).
    func stateOwner() throws -> Privileges.Identity? {
        guard Self.invokingUID == 0, geteuid() == 0 else { return nil }
        let path = paths.database
        let directory = path.lastIndex(of: "/").map { String(path[..<$0]) } ?? "."
        return try Privileges.owner(ofDirectory: directory.isEmpty ? "/" : directory)
    }

    /// As root, becomes the agent's user for good (see `stateOwner`); otherwise does nothing.
    func becomeStateOwner() throws {
        _ = paths  // fixes the caller's paths before the switch
        if let owner = try stateOwner() { try Privileges.drop(to: owner) }
    }

    /// Opens an existing database, or nil when there is none yet.
    func existingStore() throws -> AgentStore? {
        guard access(paths.database, F_OK) == 0 else { return nil }
        return try openStore()
    }
}

/// A failure with its exit code and message.
enum Failure: Error {
    case usage(String)
    case invalid(String)
    case unreadable(String)
    case unavailable(String)

    var code: Int32 {
        switch self {
        case .usage: 64
        case .invalid: 65
        case .unreadable: 66
        case .unavailable: 69
        }
    }

    var message: String {
        switch self {
        case .usage(let m), .invalid(let m), .unreadable(let m), .unavailable(let m): m
        }
    }
}

extension ParsableCommand {
    /// Runs `body`, turning failures into their message and exit code.
    func reporting(_ body: () throws -> Void) throws {
        do {
            try body()
        } catch let failure as Failure {
            Output.error("lmx-pair: \(failure.message)")
            throw ExitCode(failure.code)
        }
    }
}

// MARK: - import

struct Import: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "import",
        abstract: "Import pairings from QR images, text files, address books or standard input (-).")

    @Argument(help: ArgumentHelp("PNG or JPEG with a QR code, a text file with a code or link, lmx-connections.json, or - for standard input.", valueName: "file"))
    var files: [String]

    @Flag(name: .long, help: "Show what would be imported; write nothing.")
    var dryRun = false

    @Flag(name: .long, help: "Wait for the agent's verdict on the new endpoints and print it.")
    var probe = false

    @Option(name: .long, help: ArgumentHelp("How long --probe waits, in seconds.", valueName: "seconds"))
    var probeTimeout: Double = 15

    @Option(name: .long, help: ArgumentHelp("Which code to import when an image holds several, counting from 1.", valueName: "n"))
    var code: Int?

    @Flag(name: .long, help: "Accept plain http:// tunnels (private test setups only: keys travel unencrypted).")
    var allowInsecure = false

    @Flag(name: .long, help: "Print the result as JSON.")
    var json = false

    @OptionGroup var locations: Locations

    func validate() throws {
        if files.isEmpty { throw ValidationError("name at least one file (or - for standard input)") }
        if let code, code < 1 { throw ValidationError("--code counts from 1") }
        if probeTimeout <= 0 || probeTimeout > 600 { throw ValidationError("--probe-timeout must be between 0 and 600 seconds") }
        if files.filter({ $0 == "-" }).count > 1 { throw ValidationError("standard input (-) can be read once") }
    }

    func run() throws {
        try reporting {
            let parser = PairingParser(allowInsecure: allowInsecure, now: Int64(time(nil)))
            // Read and validate everything first: anything refused imports nothing.
            var payloads: [PairingUpload.Payload] = []
            var pairings: [Pairing] = []
            // The files are read with the caller's rights (sudo: root's); images are decoded,
            // and the database and socket used, only after root has become the agent's user.
            let raw = try files.map { file in
                let name = file == "-" ? "standard input" : file
                return (name, try PayloadReader.readBytes(file, name: name))
            }
            try locations.becomeStateOwner()
            for (name, bytes) in raw {
                let input = try PayloadReader.payload(bytes, name: name, code: code)
                do {
                    let parsed = try parser.parse(input.bytes)
                    payloads.append(PairingUpload.Payload(text: String(decoding: input.bytes, as: UTF8.self), format: parsed.first?.format))
                    pairings += parsed
                } catch {
                    throw Failure.invalid("\(input.name): \(error)")
                }
            }
            if dryRun {
                if json {
                    Output.json(pairings.map { PairingImportResult(pairing: $0.summary, updated: false) })
                } else {
                    for pairing in pairings { Output.out(Describe.pairing(pairing.summary, verb: "would import")) }
                    Output.out("dry run: nothing written")
                }
                return
            }
            try importPairings(payloads: payloads, pairings: pairings)
        }
    }

    private func importPairings(payloads: [PairingUpload.Payload], pairings: [Pairing]) throws {
        let upload = PairingUpload(payloads: payloads, allowInsecure: allowInsecure)
        let client = locations.client
        let response: StatusResponse
        let body = Array((try? JSONEncoder().encode(upload)) ?? Data())
        do {
            response = try client.request("POST", "/v1/pairings", body: body)
        } catch .notRunning {
            // No agent: straight into its database, for its next start.
            let store = try locations.openStore()
            let results: [PairingImport]
            do {
                results = try store.importPairings(pairings, at: Double(time(nil)))
            } catch {
                throw Failure.unavailable("could not save to \(locations.paths.database): \(error)")
            }
            let summaries = results.map { PairingImportResult(pairing: $0.stored.summary, updated: $0.isUpdate) }
            report(summaries)
            if !json {
                Output.out("lmx-agentd is not running: saved to \(locations.paths.database); it is used at the agent's next start")
            }
            if probe { Output.error("lmx-pair: not probed: lmx-agentd is not running") }
            return
        } catch .forbidden {
            throw Failure.unavailable("permission denied on \(locations.paths.socket): run lmx-pair as root (sudo) or as the agent's user")
        } catch {
            throw Failure.unavailable("\(error); retry, or stop the agent to write its database directly")
        }
        switch response.status {
        case 201:
            guard let results = try? JSONDecoder().decode([PairingImportResult].self, from: Data(response.body)) else {
                throw Failure.unavailable("unexpected answer from lmx-agentd")
            }
            if probe {
                report(try waitForVerdicts(results))
            } else {
                report(results)
            }
        case 403:
            throw Failure.unavailable("lmx-agentd refused: only root or the agent's own user may import pairings (try sudo)")
        case 422:
            throw Failure.invalid("lmx-agentd refused the pairing: \(Self.reason(response))")
        default:
            throw Failure.unavailable("lmx-agentd could not import: \(Self.reason(response))")
        }
    }

    static func reason(_ response: StatusResponse) -> String {
        (try? JSONDecoder().decode(StatusAPI.ErrorBody.self, from: Data(response.body)))?.reason ?? "HTTP \(response.status)"
    }

    private func report(_ results: [PairingImportResult]) {
        if json {
            Output.json(results)
            return
        }
        for result in results {
            Output.out(Describe.pairing(result.pairing, verb: result.updated ? "updated" : "imported"))
        }
    }

    /// Polls the agent until each new route has a verdict (or the timeout).
    private func waitForVerdicts(_ results: [PairingImportResult]) throws -> [PairingImportResult] {
        let ids = Set(results.map(\.pairing.id))
        let deadline = Date().addingTimeInterval(probeTimeout)
        var latest = results
        while true {
            if let response = try? locations.client.request("GET", "/v1/pairings"), response.status == 200,
                let all = try? JSONDecoder().decode([PairingSummary].self, from: Data(response.body))
            {
                let mine = all.filter { ids.contains($0.id) }
                latest = results.map { result in
                    var result = result
                    if let fresh = mine.first(where: { $0.id == result.pairing.id }) { result.pairing = fresh }
                    return result
                }
                let done = mine.count == ids.count && mine.allSatisfy { ($0.routes ?? []).allSatisfy { $0.verdict != nil } }
                if done { return latest }
            }
            if Date() >= deadline {
                Output.error("lmx-pair: no verdict within \(probeTimeout) s; see lmx-pair list or lmx-status")
                return latest
            }
            usleep(100_000)
        }
    }
}

// MARK: - list

struct List: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List pairings (secrets are shown as set, never their values).")

    @Flag(name: .long, help: "Print JSON.")
    var json = false

    @OptionGroup var locations: Locations

    func run() throws {
        try reporting {
            try locations.becomeStateOwner()
            var summaries: [PairingSummary]
            do {
                let response = try locations.client.request("GET", "/v1/pairings")
                guard response.status == 200, let all = try? JSONDecoder().decode([PairingSummary].self, from: Data(response.body)) else {
                    throw Failure.unavailable("lmx-agentd could not list pairings: \(Import.reason(response))")
                }
                summaries = all
            } catch let error as StatusClientError {
                guard case .notRunning = error else { throw Failure.unavailable(error.description) }
                summaries = try locations.existingStore().map { store in
                    do { return try store.pairings().map(\.summary) } catch {
                        throw Failure.unavailable("cannot read \(locations.paths.database): \(error)")
                    }
                } ?? []
            }
            if json { return Output.json(summaries) }
            if summaries.isEmpty {
                Output.out("no pairings; import one with: lmx-pair pairing.png")
                return
            }
            for summary in summaries { Output.out(Describe.pairing(summary, verb: nil)) }
        }
    }
}

// MARK: - remove

struct Remove: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Remove a pairing; the agent drops its endpoints at once.")

    @Argument(help: ArgumentHelp("The pairing's id (from lmx-pair list), or its name.", valueName: "id"))
    var id: String

    @OptionGroup var locations: Locations

    func run() throws {
        try reporting {
            try locations.becomeStateOwner()
            let path = "/v1/pairings/" + Pairing.percentEncodeComponent(id)
            do {
                let response = try locations.client.request("DELETE", path)
                switch response.status {
                case 200:
                    let summary = try? JSONDecoder().decode(PairingSummary.self, from: Data(response.body))
                    Output.out("removed \(summary?.id ?? id)\(summary.map { " (\($0.name ?? $0.url ?? $0.lan ?? ""))" } ?? "")")
                case 404: throw Failure.invalid("no pairing \(id); see lmx-pair list")
                case 403: throw Failure.unavailable("lmx-agentd refused: only root or the agent's own user may remove pairings (try sudo)")
                default: throw Failure.unavailable("lmx-agentd could not remove it: \(Import.reason(response))")
                }
            } catch let error as StatusClientError {
                guard case .notRunning = error else { throw Failure.unavailable(error.description) }
                guard let store = try locations.existingStore(), let removed = try? store.removePairing(id) else {
                    throw Failure.invalid("no pairing \(id); see lmx-pair list")
                }
                    Output.out("removed \(removed.pairing.id) (\(removed.pairing.label))")
            }
        }
    }
}

// MARK: - export

struct Export: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show a pairing as a QR code to carry it to another machine (it holds the secrets).")

    @Argument(help: ArgumentHelp("The pairing's id (from lmx-pair list), or its name.", valueName: "id"))
    var id: String

    @Option(name: .long, help: ArgumentHelp("Write the QR code to this PNG file (created readable by you only).", valueName: "file"))
    var png: String?

    @Flag(name: .long, help: "Draw the QR code in the terminal.")
    var terminal = false

    @OptionGroup var locations: Locations

    func validate() throws {
        if png == nil && !terminal { throw ValidationError("choose --png FILE or --terminal") }
    }

    func run() throws {
        try reporting {
            // The secrets are only in the database: read it directly (owner only), as the agent's
            // user when root (the output file is then written with the caller's rights).
            let all: [StoredPairing] = try Privileges.acting(as: locations.stateOwner()) {
                guard let store = try locations.existingStore() else {
                    throw Failure.invalid("no pairing \(id): there is no database at \(locations.paths.database) yet")
                }
                do { return try store.pairings() } catch {
                    throw Failure.unavailable("cannot read \(locations.paths.database): \(error)")
                }
            }
            guard let match = AgentStore.match(id, in: all) else {
                throw Failure.invalid("no pairing \(id); see lmx-pair list")
            }
            let matrix: QRMatrix
            do { matrix = try QREncoder.matrix(match.pairing.token()) } catch {
                throw Failure.invalid("\(id): \(error)")
            }
            if let png {
                let bytes: [UInt8]
                do { bytes = try QREncoder.png(matrix) } catch { throw Failure.unavailable("\(error)") }
                try PrivateFile.write(bytes, to: png)
                Output.out("wrote \(png) (readable by you only: it holds the pairing's secrets); on the other machine: lmx-pair \(png)")
            }
            if terminal {
                Output.out(QREncoder.terminal(matrix))
                Output.out("\(match.pairing.id) \(match.pairing.label): scan with lmx-pair on the other machine (the code holds the pairing's secrets)")
            }
        }
    }
}
