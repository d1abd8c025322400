import Foundation
import Testing

@testable import LMXCore

@Suite("Pairing payloads (CONTRACT §4)")
struct PairingTests {
    static let now: Int64 = 1_760_000_000
    let parser = PairingParser(now: PairingTests.now)

    private func one(_ text: String, _ parser: PairingParser? = nil) throws -> Pairing {
        let all = try (parser ?? self.parser).parse(text)
        #expect(all.count == 1)
        return all[0]
    }

    private func error(_ text: String, _ parser: PairingParser? = nil) -> PairingError? {
        do {
            _ = try (parser ?? self.parser).parse(text)
            return nil
        } catch {
            return error
        }
    }

    @Test(
        "an address given as a URL, with a zone or link-local is refused by what it is, naming the address to give, never the URL's secrets"
    )
    func addressAsURLOrZoned() {
        func refusal(_ text: String) -> String {
            do {
                _ = try HostPort.parse(text, field: "--host", defaultPort: HostPort.defaultPort)
                return "accepted"
            } catch { return error.description }
        }
        let url = refusal("https://user:pw@studio.example:1234/v1?key=SECRET")
        #expect(url.contains("is a URL") && url.contains("--host studio.example:1234"), "\(url)")
        #expect(!url.contains("SECRET") && !url.contains("pw"), "\(url)")
        let plain = refusal("http://10.254.0.11")
        #expect(plain.contains("is a URL") && plain.contains("10.254.0.11"), "\(plain)")
        let v6 = refusal("http://[fd00::5]:8080/")
        #expect(v6.contains("[fd00::5]:8080"), "\(v6)")
        let zoned = refusal("[fe80::1%eth0]:1234")
        #expect(zoned.contains("zone") && zoned.contains("lmx-discover"), "\(zoned)")
        // Without its zone a link-local address reaches nothing (connect() needs the interface).
        let bare = refusal("[fe80::1]:1234")
        #expect(bare.contains("link-local") && bare.contains("lmx-discover"), "\(bare)")
        #expect(refusal("[fd00::5]:8080") == "accepted")
    }

    @Test("the v1 token with every field")
    func tokenFull() throws {
        let p = try one(
            "opta-lmx://pair?v=1&name=Studio&url=https%3A%2F%2Fquiet-river-1234.trycloudflare.com&key=ADMIN&api_key=INFER&cf_id=ID.access&cf_secret=SECRET&instance=Mono512%3A1234&lan=192.168.188.11%3A1234&exp=1767225600"
        )
        #expect(p.format == .token)
        #expect(p.name == "Studio")
        #expect(p.wan?.url == "https://quiet-river-1234.trycloudflare.com")
        #expect(
            p.wan?.credentials
                == Credentials(
                    adminKey: "ADMIN", inferenceKey: "INFER", accessClientID: "ID.access", accessClientSecret: "SECRET")
        )
        #expect(p.instance == "Mono512:1234")
        #expect(p.lan == HostPort(host: "192.168.188.11", port: 1234))
        #expect(p.expiresAt == 1_767_225_600)
        let routes = p.routes()
        #expect(routes.map(\.id) == ["wan/https://quiet-river-1234.trycloudflare.com", "lan/192.168.188.11:1234"])
        // The server's own keys go to the LAN address the user gave; the Access token never does.
        #expect(routes[1].credentials == Credentials(adminKey: "ADMIN", inferenceKey: "INFER"))
        #expect(p.routes(lanKeys: .never)[1].credentials.isEmpty, "lan_keys: never keeps every key off the LAN")
        #expect(routes.allSatisfy { $0.pinnedInstance == "Mono512:1234" && $0.source == .pairing })
    }

    @Test("v1 token errors name the field and never the secret")
    func tokenErrors() {
        #expect(error("opta-lmx://pair?url=https%3A%2F%2Fa.example")?.field == "v")
        #expect(error("opta-lmx://pair?v=2&url=https%3A%2F%2Fa.example")?.kind == .unsupportedVersion)
        #expect(error("opta-lmx://pair?v=1")?.field == "url")
        let insecure = error("opta-lmx://pair?v=1&url=http%3A%2F%2Fa.example&key=TOPSECRET")
        #expect(insecure?.kind == .insecure)
        #expect(insecure?.description.contains("TOPSECRET") == false)
        #expect(error("opta-lmx://pair?v=1&url=https%3A%2F%2Fa.example&cf_id=X")?.field == "cf_secret")
        #expect(error("opta-lmx://pair?v=1&url=https%3A%2F%2Fa.example&cf_secret=TOPSECRET")?.field == "cf_id")
        #expect(error("opta-lmx://pair?v=1&url=https%3A%2F%2Fa.example&exp=1000")?.kind == .expired)
        #expect(error("opta-lmx://pair?v=1&url=https%3A%2F%2Fa.example&exp=soon")?.field == "exp")
        #expect(error("opta-lmx://pair?v=1&v=1&url=https%3A%2F%2Fa.example")?.kind == .duplicateField)
        let dup = error("opta-lmx://pair?v=1&url=https%3A%2F%2Fa.example&key=TOPSECRET&key=TOPSECRET2")
        #expect(dup?.field == "key")
        #expect(dup?.description.contains("TOPSECRET") == false)
        let long = String(repeating: "k", count: 2049)
        #expect(error("opta-lmx://pair?v=1&url=https%3A%2F%2Fa.example&key=\(long)")?.kind == .tooLong)
        let control = error("opta-lmx://pair?v=1&url=https%3A%2F%2Fa.example&key=TOP%0ASECRET")
        #expect(control?.kind == .controlCharacter)
        #expect(control?.field == "key")
        #expect(error("opta-lmx://pair?v=1&url=https%3A%2F%2Fa.example&lan=10.0.0.1")?.field == "lan")
        #expect(error("opta-lmx://pair?v=1&url=https%3A%2F%2Fa.example&lan=10.0.0.1%3A70000")?.field == "lan")
        #expect(error("opta-lmx://pair?v=1&url=https%3A%2F%2Fuser%3Apw%40a.example")?.field == "url")
        #expect(error("opta-lmx://pair?v=1&url=https%3A%2F%2Fa.example&key=%ZZ")?.kind == .malformed)
        #expect(error("opta-lmx://other?v=1")?.kind == .malformed)
    }

    @Test(
        "URLs split by URLComponents: unencoded spaces and UTF-8 accepted, escapes kept; a broken escape names its field; no query in a message"
    )
    func urlSplitting() throws {
        // Some generators leave a label's spaces and UTF-8 unencoded: read as if encoded, and the
        // other fields' escapes are not encoded a second time.
        let raw = try one("opta-lmx://pair?v=1&url=https%3A%2F%2Fa.example&name=My Studio é&key=K%2B1")
        #expect(raw.name == "My Studio é")
        #expect(raw.wan?.url == "https://a.example")
        #expect(raw.wan?.credentials.adminKey == "K+1")
        // A broken escape is blamed on the field it is in, and the value (maybe a key) is not shown.
        let broken = error("https://a.example/?key=SECRET%zz")
        #expect(broken?.field == "key" && broken?.kind == .malformed)
        #expect(broken?.description.contains("SECRET") == false)
        // A URL that is not one is quoted up to its query only: keys stay out of the message.
        let port = error("https://a.example:abc/path?key=SECRET")
        #expect(port?.field == "url")
        #expect(port?.description.contains("'https://a.example:abc/path'") == true)
        #expect(port?.description.contains("SECRET") == false)
        // user@host hidden behind a backslash, and a host with a space, are refused.
        #expect(error(#"https://a.example\@evil.example/"#)?.field == "url")
        #expect(error("opta-lmx://pair?v=1&url=https://a b.example")?.field == "url")
        #expect(error("https://a.example:70000")?.field == "url")
    }

    @Test("unknown fields are ignored; http tunnels pass with --allow-insecure; + is a space only in the name")
    func tokenLenient() throws {
        let p = try one(
            "opta-lmx://pair?v=1&url=https%3A%2F%2FA.Example%3A8443%2Fsome%2Fpath&future=x&name=My+Box&key=a+b")
        #expect(p.wan?.url == "https://a.example:8443")
        #expect(p.name == "My Box")
        #expect(p.wan?.credentials.adminKey == "a+b")
        let insecure = try one(
            "opta-lmx://pair?v=1&url=http%3A%2F%2F10.0.0.1%3A1234", PairingParser(allowInsecure: true, now: Self.now))
        #expect(insecure.wan?.url == "http://10.0.0.1:1234")
    }

    @Test("a bare tunnel URL: scheme, host and port kept, path dropped, key is the admin key")
    func tunnelURL() throws {
        let p = try one("https://quiet-river-1234.trycloudflare.com?key=ADMIN_KEY")
        #expect(p.format == .tunnelURL)
        #expect(
            p.wan
                == WANEndpoint(
                    url: "https://quiet-river-1234.trycloudflare.com", credentials: Credentials(adminKey: "ADMIN_KEY")))
        #expect(p.lan == nil)
        let q = try one("  https://Tunnel.Example.com:8443/v1/models\n")
        #expect(q.wan?.url == "https://tunnel.example.com:8443")
        #expect(q.wan?.credentials.isEmpty == true)
        #expect(error("http://quiet-river-1234.trycloudflare.com")?.kind == .insecure)
        #expect(error("https://bad_host.example")?.field == "url")
        #expect(error("https://[fe80::1")?.field == "url")
    }

    @Test("the dashboard connect link: LAN host and port, optional https tunnel, via anything")
    func connectLink() throws {
        let p = try one(
            "https://lmx.optalocal.com/connect?host=192.168.188.11&port=1234&via=lan&tunnel=https%3A%2F%2Fx.trycloudflare.com"
        )
        #expect(p.format == .connectLink)
        #expect(p.lan == HostPort(host: "192.168.188.11", port: 1234))
        #expect(p.wan?.url == "https://x.trycloudflare.com")
        let v6 = try one("https://lmx.optalocal.com/connect?host=%5Bfd00%3A%3A5%5D&port=8080&via=bogus")
        #expect(v6.lan == HostPort(host: "fd00::5", port: 8080))
        #expect(v6.lan?.description == "[fd00::5]:8080")
        #expect(v6.wan == nil)
        let named = try one("https://lmx.optalocal.com/connect?host=Mono512.local&port=1234")
        #expect(named.lan?.host == "mono512.local")
        #expect(
            error("https://lmx.optalocal.com/connect?host=192.168.188.11&port=1234&tunnel=http%3A%2F%2Fx.example")?
                .field == "tunnel")
        #expect(error("https://lmx.optalocal.com/connect?port=1234")?.field == "host")
        #expect(error("https://lmx.optalocal.com/connect?host=999.1.1.1&port=1234")?.field == "host")
        #expect(error("https://lmx.optalocal.com/connect?host=10.0.0.1&port=0")?.field == "port")
        #expect(error("https://lmx.optalocal.com/connect?host=10.0.0.1&port=12a")?.field == "port")
        #expect(
            error("https://lmx.optalocal.com/connect?host=\(String(repeating: "a", count: 254))&port=1")?.field
                == "host")
        #expect(error("https://lmx.optalocal.com/connect?host=fd00::1&port=1")?.field == "host")
    }

    @Test("the account pairing link: only host and port matter")
    func pairLink() throws {
        let p = try one(
            "https://lmx.optalocal.com/pair?session=2b1f8e0a-1111-4222-8333-944445555666&deviceId=7c1d-aa&host=10.1.2.3&port=1234"
        )
        #expect(p.format == .pairLink)
        #expect(p.lan == HostPort(host: "10.1.2.3", port: 1234))
        #expect(p.wan == nil)
        #expect(p.routes().map(\.baseURL) == ["http://10.1.2.3:1234"])
    }

    @Test("the desktop manager's sign-in link is unwrapped to the /pair link inside it")
    func signInLink() throws {
        let inner = "https://lmx.optalocal.com/pair?host=192.168.188.11&port=1234"
        let encoded = inner.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
        let p = try one("https://accounts.optalocal.com/sign-in?redirect_to=\(encoded)")
        #expect(p.format == .pairLink)
        #expect(p.lan == HostPort(host: "192.168.188.11", port: 1234))
        #expect(p.wan == nil)
        // A relative target is on the same site; a connect link inside keeps its tunnel.
        let connect = "/connect?host=10.1.2.3&port=1234&tunnel=https%3A%2F%2Fx.trycloudflare.com"
        let c = try one(
            "https://accounts.optalocal.com/sign-in?redirect_to=\(connect.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)"
        )
        #expect(c.format == .connectLink)
        #expect(c.wan?.url == "https://x.trycloudflare.com")
        #expect(c.lan == HostPort(host: "10.1.2.3", port: 1234))
    }

    @Test("an Opta web-app host is never a tunnel")
    func optaWebAppIsNoTunnel() throws {
        // Before: these were imported as a tunnel to https://accounts.optalocal.com.
        #expect(error("https://accounts.optalocal.com/sign-in")?.kind == .unknownFormat)
        #expect(error("https://lmx.optalocal.com")?.kind == .unknownFormat)
        #expect(error("https://OPTALOCAL.com./?key=x")?.kind == .unknownFormat)
        #expect(
            error("https://accounts.optalocal.com/sign-in?redirect_to=https%3A%2F%2Faccounts.optalocal.com%2Fsign-in")?
                .field == "redirect_to")
        #expect(
            error(
                "https://accounts.optalocal.com/sign-in?redirect_to=http%3A%2F%2Flmx.optalocal.com%2Fpair%3Fhost%3D10.0.0.1"
            )?.field == "redirect_to")
        #expect(error("opta-lmx://pair?v=1&url=https%3A%2F%2Flmx.optalocal.com")?.field == "url")
        #expect(
            error("https://lmx.optalocal.com/connect?host=10.0.0.1&tunnel=https%3A%2F%2Faccounts.optalocal.com")?.field
                == "tunnel")
        #expect(
            error(#"{"entries":[{"host":"10.0.0.1","tunnelUrl":"https://lmx.optalocal.com"}]}"#)?.field
                == "entries[0].tunnelUrl")
        // Look-alikes are ordinary hosts.
        #expect(try one("https://optalocal.com.evil.example").wan?.url == "https://optalocal.com.evil.example")
        #expect(try one("https://notoptalocal.com").wan?.url == "https://notoptalocal.com")
    }

    @Test("the address book, camelCase and snake_case, one pairing per entry")
    func addressBook() throws {
        let all = try parser.parse(
            """
            {"entries":[
              {"id":"192.168.188.11:1234","label":"LMX @ Studio","host":"192.168.188.11","port":1234,"tunnelUrl":"https://example.trycloudflare.com","lastConnectedVia":"mdns"},
              {"id":"b","label":"Lab","host":"lab.local","port":"8080","tunnel_url":null,"last_connected_via":"manual","extra":[1,2]}
            ], "version": 3}
            """)
        #expect(all.count == 2)
        #expect(all[0].format == .addressBook)
        #expect(all[0].name == "LMX @ Studio")
        #expect(all[0].lan == HostPort(host: "192.168.188.11", port: 1234))
        #expect(all[0].wan?.url == "https://example.trycloudflare.com")
        #expect(all[1].lan == HostPort(host: "lab.local", port: 8080))
        #expect(all[1].wan == nil)
        #expect(
            error(#"{"entries":[{"host":"10.0.0.1","port":1234},{"host":"10.0.0.2","port":99999}]}"#)?.field
                == "entries[1].port")
        #expect(error(#"{"entries":[{"label":"nothing"}]}"#)?.field == "entries[0]")
        #expect(error(#"{"entries":[]}"#)?.kind == .empty)
        #expect(
            error(#"{"entries":[{"host":"10.0.0.1","tunnelUrl":"http://x.example"}]}"#)?.field == "entries[0].tunnelUrl"
        )
        #expect(error(#"{"entries": 5}"#)?.kind == .malformed)
        #expect(error("{not json")?.kind == .malformed)
    }

    @Test("not a pairing at all: empty, binary, unknown text each have their own error")
    func notPairings() {
        #expect(error("")?.kind == .empty)
        #expect(error("   \n")?.kind == .empty)
        #expect((try? parser.parse([0xFF, 0xFE, 0x00, 0x81])) == nil)
        do {
            _ = try parser.parse([0xFF, 0xFE, 0x00, 0x81])
        } catch {
            #expect(error.kind == .notText)
        }
        #expect(error("hello world")?.kind == .unknownFormat)
        #expect(error("ftp://x.example")?.kind == .unknownFormat)
        #expect(error("https://a.example/\u{07}")?.kind == .controlCharacter)
    }

    @Test("ids are stable and follow the identity: instance, else URL, else LAN address")
    func identity() throws {
        let a = try one("opta-lmx://pair?v=1&url=https%3A%2F%2Fone.example&instance=box")
        let b = try one("opta-lmx://pair?v=1&url=https%3A%2F%2Ftwo.example&instance=box&key=NEW")
        #expect(a.id == b.id)
        #expect(a.id.count == 9 && a.id.hasPrefix("p"))
        #expect(a.isSameServer(as: b))
        let tunnel = try one("https://one.example?key=K")
        let connect = try one(
            "https://lmx.optalocal.com/connect?host=10.0.0.1&port=1234&tunnel=https%3A%2F%2Fone.example")
        #expect(tunnel.isSameServer(as: connect))
        let updated = tunnel.updated(by: connect)
        #expect(updated.wan?.credentials.adminKey == "K", "a connect link carries no secrets: the old ones stay")
        #expect(updated.lan == HostPort(host: "10.0.0.1", port: 1234))
        let moved = try one("opta-lmx://pair?v=1&url=https%3A%2F%2Fthree.example&instance=box")
        #expect(b.updated(by: moved).wan?.credentials.isEmpty == true, "secrets never follow a new host")
    }

    @Test("export then import gives the same pairing, for every format")
    func roundTrip() throws {
        let inputs = [
            "opta-lmx://pair?v=1&name=Studio+%C3%A9%26%3D&url=https%3A%2F%2Fquiet-river-1234.trycloudflare.com&key=A%2BB%2FC%3D&api_key=INFER&cf_id=ID.access&cf_secret=SECRET&instance=Mono512%3A1234&lan=%5Bfd00%3A%3A1%5D%3A1234&exp=1767225600",
            "https://quiet-river-1234.trycloudflare.com?key=ADMIN_KEY",
            "https://lmx.optalocal.com/connect?host=192.168.188.11&port=1234&via=lan&tunnel=https%3A%2F%2Fx.trycloudflare.com",
            "https://lmx.optalocal.com/pair?session=s&deviceId=d&host=10.1.2.3&port=1234",
            #"{"entries":[{"label":"LMX @ Studio","host":"studio.local","port":1234}]}"#,
        ]
        for input in inputs {
            for pairing in try parser.parse(input) {
                let again = try one(pairing.token())
                #expect(again.wan == pairing.wan, "\(input)")
                #expect(again.lan == pairing.lan)
                #expect(again.name == pairing.name)
                #expect(again.instance == pairing.instance)
                #expect(again.expiresAt == pairing.expiresAt)
                #expect(again.id == pairing.id)
            }
        }
    }

    @Test("summaries name the secrets and never hold them")
    func summary() throws {
        let p = try one("opta-lmx://pair?v=1&url=https%3A%2F%2Fa.example&key=TOPSECRET&cf_id=ID&cf_secret=TOPSECRET2")
        #expect(p.summary.secrets == ["admin_key", "cf_access"])
        let json = String(decoding: try StatusAPI.encoder.encode(p.summary), as: UTF8.self)
        #expect(!json.contains("TOPSECRET"))
        #expect(json.contains("\"url\":\"https://a.example\""))
    }

    @Test(
        "a LAN hint that is a host name gets no keys over plain HTTP (whoever answers for the name could claim it); an IP address does"
    )
    func namedLANGetsNoKeys() throws {
        let named = try one(
            "opta-lmx://pair?v=1&url=https%3A%2F%2Fa.example&api_key=INFER&key=ADMIN&lan=mono512.local%3A1234")
        #expect(named.lanIsName)
        let namedLAN = named.routes().first { $0.via == .lan }
        #expect(namedLAN?.credentials.isEmpty == true)
        #expect(named.routes().first { $0.via == .wan }?.credentials.inferenceKey == "INFER")
        #expect(named.summary.lanIsName)
        #expect(named.summary.describe(verb: "imported").contains("gets no keys over"))
        let literal = try one("opta-lmx://pair?v=1&url=https%3A%2F%2Fa.example&api_key=INFER&lan=192.168.188.11%3A1234")
        #expect(!literal.lanIsName && !literal.summary.lanIsName)
        #expect(literal.routes().first { $0.via == .lan }?.credentials.inferenceKey == "INFER")
        #expect(!literal.summary.describe(verb: "imported").contains("gets no keys"))
        let v6 = try one("opta-lmx://pair?v=1&url=https%3A%2F%2Fa.example&api_key=INFER&lan=%5Bfd00%3A%3A1%5D%3A1234")
        #expect(!v6.lanIsName && !v6.summary.lanIsName)
        let book = try parser.parse(
            #"{"entries":[{"host":"studio.local","port":1234,"tunnelUrl":"https://e.example"}]}"#)
        #expect(book.first?.lanIsName == true)
        #expect(book.first?.routes().first { $0.via == .lan }?.credentials.isEmpty == true)
    }

    @Test("tens of thousands of generated and mutated inputs: no crash, every accepted one round-trips")
    func fuzz() throws {
        var rng = SplitMix64(seed: 0x5EED)
        let seeds = [
            "opta-lmx://pair?v=1&name=Studio&url=https%3A%2F%2Fquiet-river-1234.trycloudflare.com&key=ADMIN&api_key=INFER&cf_id=ID.access&cf_secret=SECRET&instance=Mono512%3A1234&lan=192.168.188.11%3A1234&exp=1767225600",
            "https://quiet-river-1234.trycloudflare.com?key=ADMIN_KEY",
            "https://lmx.optalocal.com/connect?host=192.168.188.11&port=1234&via=lan&tunnel=https%3A%2F%2Fx.trycloudflare.com",
            "https://lmx.optalocal.com/pair?session=a&deviceId=b&host=%5B2001%3Adb8%3A%3A1%5D&port=1234",
            #"{"entries":[{"id":"x","label":"L","host":"10.0.0.1","port":1234,"tunnelUrl":"https://e.example"}]}"#,
        ]
        let alphabet = Array("%&=?:/[]{}\",.+-_~@#0123456789abcdefABCDEF xyz\u{0}\u{7f}é".utf8)
        var accepted = 0
        for i in 0..<30_000 {
            var bytes = Array(seeds[i % seeds.count].utf8)
            for _ in 0...(rng.next() % 6) {
                guard !bytes.isEmpty else { break }
                let at = Int(rng.next() % UInt64(bytes.count))
                switch rng.next() % 5 {
                case 0: bytes[at] = alphabet[Int(rng.next() % UInt64(alphabet.count))]
                case 1: bytes.remove(at: at)
                case 2: bytes.insert(alphabet[Int(rng.next() % UInt64(alphabet.count))], at: at)
                case 3: bytes.insert(contentsOf: bytes[at...].prefix(Int(rng.next() % 12)), at: at)
                default: bytes = Array(bytes.prefix(at))
                }
            }
            guard let pairings = try? parser.parse(bytes) else { continue }
            for pairing in pairings {
                accepted += 1
                let again = try parser.parse(pairing.token())
                #expect(again.count == 1)
                #expect(
                    again.first?.wan == pairing.wan && again.first?.lan == pairing.lan && again.first?.id == pairing.id
                        && again.first?.name == pairing.name && again.first?.instance == pairing.instance,
                    "\(String(decoding: bytes, as: UTF8.self))")
            }
        }
        #expect(accepted > 1000)
    }
}
