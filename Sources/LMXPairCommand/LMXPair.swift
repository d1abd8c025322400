import ArgumentParser
import Dispatch
import LMXCore
import LMXImage
import LMXProbe
import LMXStatusClient
import LMXStore
import LMXSystem

public struct LMXPair: ParsableCommand {
    public init() {}

    public static let configuration = CommandConfiguration(
        commandName: "lmx-pair",
        abstract: "Pair this machine with an Opta LMX server: import QR codes, links and address books.",
        discussion: """
            lmx-pair pairing.png imports the pairing in a QR code (PNG or JPEG); a text file, a \
            link on standard input (-) or ~/.config/opta/lmx-connections.json work too. Accepted: \
            opta-lmx://pair?v=1&… tokens, https:// tunnel URLs (?key=), dashboard /connect links, \
            account /pair links and Opta address books.

            lmx-pair --host ADDR[:PORT] asks that address by the LMX contract (port 1234 when none \
            is given), shows what the server says about itself, and pairs its LAN address: for a \
            server that nothing announces (another subnet, a network that drops mDNS).

            When lmx-agentd runs, the pairing goes through its socket and is probed at once; \
            otherwise it is saved in the agent's database for its next start.

            Exit codes: 0 done, 64 usage, 65 no valid pairing in the input (no code, bad payload, \
            expired; --host: no Opta LMX server answers there) or no such pairing, 66 file missing or unreadable, 69 agent or database \
            unavailable.
            """,
        version: StatusAPI.version,
        subcommands: [Import.self, List.self, Remove.self, Export.self],
        defaultSubcommand: Import.self)
}

/// Where the agent is (the same defaults and overrides as lmx-agentd), and its pairing book.
struct Locations: ParsableArguments {
    @Option(
        name: .long, help: ArgumentHelp("The agent's database (default: as lmx-agentd; LMX_DB).", valueName: "path"))
    var db: String?

    @Option(
        name: .long, help: ArgumentHelp("The agent's socket (default: as lmx-agentd; LMX_SOCKET).", valueName: "path"))
    var socket: String?

    /// The effective user id lmx-pair started with (read before any switch of user): root keeps
    /// root's paths after it has become the agent's user.
    static let invokingUID = Users.effective

    var paths: AgentPaths {
        var paths = RuntimeDirectory.clientPaths(uid: Self.invokingUID, environment: ProcessEnvironment.current).paths
        if let db { paths.database = db }
        if let socket { paths.socket = socket }
        return paths
    }

    /// Refuses (exit 69) a socket or database in an unsafe `/tmp/lmx-<uid>` (see RuntimeDirectory).
    public func validate() throws {
        let env = ProcessEnvironment.current
        if let warning = RuntimeDirectory.unsafeDefault(
            socketGiven: socket != nil, databaseGiven: db != nil, uid: Users.effective, environment: env)
        {
            Console.error("lmx-pair: \(warning)")
            throw ExitCode(ExitStatus.unavailable.rawValue)
        }
    }

    /// As root, the agent's user to act as on its database (see `Users.stateOwner`).
    func stateOwner() throws -> Users.Identity? {
        do { return try Users.stateOwner(of: paths.database, invokingUID: Self.invokingUID) } catch {
            throw Failure.unavailable("\(error.action): root does not follow it; pass the real path with --db")
        }
    }

    /// As root, becomes the agent's user for good (see `stateOwner`); otherwise does nothing.
    func becomeStateOwner() throws {
        _ = paths  // fixes the caller's paths before the switch
        guard let owner = try stateOwner() else { return }
        do { try Users.become(owner) } catch { throw Failure.unavailable(error.description) }
    }

    /// Through the agent when it runs, else its database (created only to import).
    func book(create: Bool = false) -> FallbackPairingBook {
        let paths = self.paths
        return FallbackPairingBook(
            primary: AgentPairingBook(client: AgentClient(socketPath: paths.socket, timeout: 10))
        ) {
            () throws(PairingBookError) -> any PairingBook in
            try DatabasePairingBook.open(
                path: paths.database, create: create, now: SystemClock.realtime().rounded(.down)
            ) {
                Console.error("lmx-pair: \($0)")
            }
        }
    }

    /// The stored pairings with their secrets, read straight from the database (to find `id`).
    func storedPairings(for id: String) throws -> [StoredPairing] {
        guard FileSystem.exists(paths.database) else {
            throw Failure.invalid("no pairing \(id): there is no database at \(paths.database) yet")
        }
        do { return try AgentStore.open(path: paths.database) { Console.error("lmx-pair: \($0)") }.pairings() } catch {
            throw Failure.unavailable("cannot read \(paths.database): \(error)")
        }
    }
}

extension ParsableCommand {
    /// Runs `body`, turning failures into their message and exit code.
    func reporting(_ body: () throws -> Void) throws {
        do {
            try body()
        } catch let error where !(error is ExitCode) {
            let failure = Failure(error)
            Console.error("lmx-pair: \(failure.message)")
            throw ExitCode(failure.code)
        }
    }
}

struct Import: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "import",
        abstract: "Import pairings from QR images, text files, address books or standard input (-).")

    @Argument(
        help: ArgumentHelp(
            "PNG or JPEG with a QR code, a text file with a code or link, lmx-connections.json, or - for standard input.",
            valueName: "file"))
    var files: [String] = []

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Ask this address by the LMX contract, show what the server says, and pair it (repeatable; port 1234 when none).",
            valueName: "addr[:port]"))
    var host: [String] = []

    @Flag(name: .long, help: "Show what would be imported; write nothing.")
    var dryRun = false

    @Flag(name: .long, help: "Wait for the agent's verdict on the new endpoints and print it.")
    var probe = false

    @Option(name: .long, help: ArgumentHelp("How long --probe waits, in seconds.", valueName: "seconds"))
    var probeTimeout: Double = 15

    @Option(
        name: .long,
        help: ArgumentHelp("Which code to import when an image holds several, counting from 1.", valueName: "n"))
    var code: Int?

    @Flag(name: .long, help: "Accept plain http:// tunnels (private test setups only: keys travel unencrypted).")
    var allowInsecure = false

    @Flag(name: .long, help: "Print the result as JSON.")
    var json = false

    @OptionGroup var locations: Locations

    func validate() throws {
        if files.isEmpty && host.isEmpty {
            throw ValidationError("name at least one file (or - for standard input), or --host ADDR[:PORT]")
        }
        for text in host {
            do { _ = try HostPort.parse(text, field: "--host", defaultPort: HostPort.defaultPort) } catch {
                throw ValidationError("\(error)")
            }
        }
        if let code, code < 1 { throw ValidationError("--code counts from 1") }
        if probeTimeout <= 0 || probeTimeout > 600 {
            throw ValidationError("--probe-timeout must be between 0 and 600 seconds")
        }
        if files.filter({ $0 == "-" }).count > 1 { throw ValidationError("standard input (-) can be read once") }
    }

    func run() throws {
        try reporting {
            let parser = PairingParser(allowInsecure: allowInsecure, now: SystemClock.unixTime())
            // The files are read with the caller's rights (sudo: root's); images are decoded,
            // and the database and socket used, only after root has become the agent's user.
            var raw = try files.map { file in
                let name = file == "-" ? "standard input" : file
                return (name, try PairingInput.readBytes(file, name: name))
            }
            raw += try askHosts()
            try locations.becomeStateOwner()
            // Everything is read and validated first: anything refused imports nothing.
            var payloads: [PairingUpload.Payload] = []
            var pairings: [Pairing] = []
            for (name, bytes) in raw {
                let input = try PairingInput.payload(bytes, name: name, code: code)
                do {
                    let parsed = try parser.parse(input.bytes)
                    payloads.append(
                        PairingUpload.Payload(
                            text: String(decoding: input.bytes, as: UTF8.self), format: parsed.first?.format))
                    pairings += parsed
                } catch {
                    throw Failure.invalid("\(input.name): \(error)")
                }
            }
            if dryRun {
                report(pairings.map { PairingImportResult(pairing: $0.summary, updated: false) }, verb: "would import")
                if !json { Console.out("dry run: nothing written") }
                return
            }
            let book = locations.book(create: true)
            var results = try book.add(
                PairingUpload(payloads: payloads, allowInsecure: allowInsecure), parsed: pairings)
            if probe && book.isLive {
                let verdicts = book.awaitVerdicts(results, timeout: probeTimeout)
                results = verdicts.results
                if !verdicts.complete {
                    Console.error("lmx-pair: no verdict within \(probeTimeout) s; see lmx-pair list or lmx-status")
                }
            }
            report(results, verb: nil)
            if !book.isLive {
                if !json {
                    Console.out(
                        "lmx-agentd is not running: saved to \(book.location); it is used at the agent's next start")
                }
                if probe { Console.error("lmx-pair: not probed: lmx-agentd is not running") }
            }
        }
    }

    /// Asks every `--host` address by the contract and shows the answer; each that is an Opta
    /// LMX server becomes a `/connect` link for its LAN address (no secrets: keys come with its
    /// pairing code).
    private func askHosts() throws -> [(String, [UInt8])] {
        guard !host.isEmpty else { return [] }
        let addresses = host.compactMap { try? HostPort.parse($0, field: "--host", defaultPort: HostPort.defaultPort) }
        let answers = Blocking.run {
            guard let prober = try? Prober(quickConnectTimeout: 3) else { return [HostAnswer]() }
            var answers: [HostAnswer] = []
            for address in addresses {
                let route = Route(
                    baseURL: "http://\(address.description)", via: .lan, source: .manual, name: address.description)
                answers.append(
                    HostAnswer(address: address, report: await prober.probe(route, timeout: 3, connectTimeout: 0)))
            }
            await prober.shutdown()
            return answers
        }
        var inputs: [(String, [UInt8])] = []
        for (address, answer) in zip(addresses, answers) {
            if !json { Console.out(answer.text) }
            guard answer.isServer else {
                throw Failure.invalid(
                    "--host \(address): no Opta LMX server answers there (\(answer.detail ?? answer.verdict.rawValue)); `lmx-discover --doctor --host \(address)` says more"
                )
            }
            let host = address.isIPv6 ? "[\(address.host)]" : address.host
            let link = "https://lmx.optalocal.com/connect?host=\(host)&port=\(address.port)&via=lan"
            inputs.append(("--host \(address)", Array(link.utf8)))
        }
        return inputs
    }

    private func report(_ results: [PairingImportResult], verb: String?) {
        if json { return Console.out(StatusAPI.prettyJSON(results)) }
        for result in results {
            Console.out(result.pairing.describe(verb: verb ?? (result.updated ? "updated" : "imported")))
        }
    }
}

struct List: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List pairings (secrets are shown as set, never their values).")

    @Flag(name: .long, help: "Print JSON.")
    var json = false

    @OptionGroup var locations: Locations

    func run() throws {
        try reporting {
            try locations.becomeStateOwner()
            let summaries = try locations.book().list()
            if json { return Console.out(StatusAPI.prettyJSON(summaries)) }
            if summaries.isEmpty { return Console.out("no pairings; import one with: lmx-pair pairing.png") }
            for summary in summaries { Console.out(summary.describe(verb: nil)) }
        }
    }
}

struct Remove: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Remove a pairing; the agent drops its endpoints at once.")

    @Argument(help: ArgumentHelp("The pairing's id (from lmx-pair list), or its name.", valueName: "id"))
    var id: String

    @OptionGroup var locations: Locations

    func run() throws {
        try reporting {
            try locations.becomeStateOwner()
            do {
                let removed = try locations.book().remove(id)
                Console.out("removed \(removed.id) (\(removed.name ?? removed.url ?? removed.lan ?? removed.id))")
            } catch PairingBookError.notFound {
                throw Failure.invalid("no pairing \(id); see lmx-pair list")
            }
        }
    }
}

struct Export: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show a pairing as a QR code to carry it to another machine (it holds the secrets).")

    @Argument(help: ArgumentHelp("The pairing's id (from lmx-pair list), or its name.", valueName: "id"))
    var id: String

    @Option(
        name: .long,
        help: ArgumentHelp("Write the QR code to this PNG file (created readable by you only).", valueName: "file"))
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
            let all = try Users.acting(as: locations.stateOwner()) { () throws in try locations.storedPairings(for: id)
            }
            guard let match = AgentStore.match(id, in: all) else {
                throw Failure.invalid("no pairing \(id); see lmx-pair list")
            }
            let matrix: QRMatrix
            do { matrix = try QREncoder.matrix(match.pairing.token()) } catch {
                throw Failure.invalid("\(id): \(error)")
            }
            if let png {
                do { try FileSystem.writeAtomically(try QREncoder.png(matrix), to: png, mode: 0o600) } catch let error
                    as SystemError
                {
                    throw Failure.unreadable(error.description)
                }
                Console.out(
                    "wrote \(png) (readable by you only: it holds the pairing's secrets); on the other machine: lmx-pair \(png)"
                )
            }
            if terminal {
                Console.out(QREncoder.terminal(matrix))
                Console.out(
                    "\(match.pairing.id) \(match.pairing.label): scan with lmx-pair on the other machine (the code holds the pairing's secrets)"
                )
            }
        }
    }
}

/// Runs async work from a synchronous command and waits for it (the work runs on the global
/// executor, never on the waiting thread).
enum Blocking {
    static func run<T: Sendable>(_ body: @escaping @Sendable () async -> T) -> T {
        let box = ResultBox<T>()
        let done = DispatchSemaphore(value: 0)
        Task {
            box.set(await body())
            done.signal()
        }
        done.wait()
        return box.value!
    }

    /// Written once by the task, read after the semaphore: the semaphore orders the two.
    private final class ResultBox<T: Sendable>: @unchecked Sendable {
        var value: T?
        func set(_ value: T) { self.value = value }
    }
}
