import Testing

@testable import LMXCore

@Suite("BaseURL: a server's base URL parsed once")
struct BaseURLTests {
    @Test("scheme, host kind and port, normalized text")
    func parts() {
        let v4 = BaseURL("HTTP://10.0.0.5:1234/")
        #expect(v4.scheme == "http" && v4.host == .ipv4("10.0.0.5") && v4.port == 1234)
        #expect(v4.text == "http://10.0.0.5:1234" && v4.hostPort == "10.0.0.5:1234" && v4.ipLiteral == "10.0.0.5")
        #expect(v4.isPlainHTTP && v4.isWellFormed)

        let zoned = BaseURL("http://[FE80::1%25lan0]:1234")
        #expect(zoned.host == .ipv6("fe80::1", zone: "lan0") && zoned.port == 1234)
        #expect(zoned.ipLiteral == "fe80::1%lan0" && zoned.hostPort == "[fe80::1%25lan0]:1234")

        let named = BaseURL("https://Quiet-River.trycloudflare.com")
        #expect(named.host == .name("quiet-river.trycloudflare.com") && named.port == nil && named.ipLiteral == nil)
        #expect(!named.isPlainHTTP && named.isWellFormed)
    }

    @Test("total: text that is not a base URL still makes a value, and says so")
    func total() {
        for text in [
            "", "10.0.0.5:1234", "ftp://x", "http://", "http://host/path", "http://u@host", "http://host:abc",
            "http://[::1", "http://[::1]x", "http://a:1:2", "http://ho st", "http://[zz::1]:80", "://",
            "http://host?key=1",
        ] {
            let url = BaseURL(text)
            #expect(!url.isWellFormed, "\(text) taken as well formed")
        }
        #expect(BaseURL("http://host:abc").port == nil)
        #expect(BaseURL("http://[::1]:99999").port == nil)
        #expect(BaseURL("10.0.0.5:1234").text == "10.0.0.5:1234")
    }

    @Test("route ids and the parts every caller used to split by hand agree with the type")
    func routes() {
        #expect(Route.identifier(baseURL: "http://10.0.0.5:1234", via: .lan) == "lan/10.0.0.5:1234")
        #expect(Route.identifier(baseURL: "https://10.0.0.5:1234", via: .lan) == "lan/https://10.0.0.5:1234")
        #expect(Route.identifier(baseURL: "HTTPS://T.example/", via: .wan) == "wan/https://t.example")
        #expect(WANEndpoint(url: "https://T.example:8443/").host == "t.example:8443")
        let route = Route(baseURL: "http://[fe80::1%25lan0]:1234", via: .lan, source: .manual, name: "x")
        #expect(route.base.ipLiteral == "fe80::1%lan0" && route.baseURL == "http://[fe80::1%25lan0]:1234")
    }
}
