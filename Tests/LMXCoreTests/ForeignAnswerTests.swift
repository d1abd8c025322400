import Testing

@testable import LMXCore

/// Answers that are not the server's, and whose key makes a run's creation repeatable: the
/// decisions as values.
@Suite("Foreign answers and run keys: what the gateway does not pass on, what it may send again")
struct ForeignAnswerTests {
    @Test(
        "a redirect to Access's login is a login page; any other redirect or a web page a portal; an HTML 5xx the edge's"
    )
    func recognised() {
        let login = "https://team.cloudflareaccess.com/cdn-cgi/access/login/x?kid=1"
        #expect(ForeignAnswer.recognise(status: 302, html: true, location: login) == .accessLogin)
        #expect(ForeignAnswer.recognise(status: 307, html: false, location: "/cdn-cgi/access/login") == .accessLogin)
        #expect(
            ForeignAnswer.recognise(status: 302, html: true, location: "http://portal.example/login")
                == .captivePortal(status: 302))
        #expect(ForeignAnswer.recognise(status: 200, html: true, location: nil) == .captivePortal(status: 200))
        #expect(ForeignAnswer.recognise(status: 530, html: true, location: nil) == .tunnelErrorPage(status: 530))
        #expect(
            ForeignAnswer.recognise(status: 502, html: true, location: nil, edge: true) == .tunnelErrorPage(status: 502)
        )
        // A server's own framework's HTML error page (a 501 to HEAD) is the server's.
        #expect(ForeignAnswer.recognise(status: 501, html: true, location: nil) == nil)
        // The server's own answers pass: JSON errors, 304, a 404 page of any type.
        #expect(ForeignAnswer.recognise(status: 200, html: false, location: nil) == nil)
        #expect(ForeignAnswer.recognise(status: 503, html: false, location: nil) == nil)
        #expect(ForeignAnswer.recognise(status: 304, html: false, location: nil) == nil)
        // A redirect that names no place leads to no page: passed on, not taken for a portal.
        #expect(ForeignAnswer.recognise(status: 302, html: true, location: nil) == nil)
        #expect(ForeignAnswer.recognise(status: 301, html: false, location: " ") == nil)
        #expect(ForeignAnswer.recognise(status: 404, html: true, location: nil) == nil)
        // The server's own redirects pass (a framework's trailing-slash 307, an https upgrade on
        // its own host): only one to another host is the network's, and a local user's request
        // for such a path must not mark the route down.
        let server = "http://192.168.1.20:1234"
        #expect(ForeignAnswer.recognise(status: 307, html: false, location: "/v1/models", server: server) == nil)
        #expect(ForeignAnswer.recognise(status: 308, html: false, location: "models", server: server) == nil)
        #expect(
            ForeignAnswer.recognise(
                status: 307, html: false, location: "http://192.168.1.20:1234/v1/models", server: server)
                == nil)
        #expect(
            ForeignAnswer.recognise(status: 301, html: true, location: "https://192.168.1.20/v1/models", server: server)
                == nil)
        #expect(
            ForeignAnswer.recognise(status: 302, html: true, location: "//portal.example/login", server: server)
                == .captivePortal(status: 302))
        #expect(
            ForeignAnswer.recognise(
                status: 302, html: true, location: "http://192.168.1.20.portal.example/", server: server)
                == .captivePortal(status: 302))
        #expect(
            ForeignAnswer.recognise(
                status: 302, html: true, location: "http://192.168.1.20@portal.example/", server: server)
                == .captivePortal(status: 302))
        #expect(
            ForeignAnswer.recognise(
                status: 302, html: false, location: "https://192.168.1.20/cdn-cgi/access/login/x", server: server)
                == .accessLogin)
        // On a path the server answers only in JSON or as an event stream: a 2xx in plain text,
        // unlabelled or as XHTML is a portal's page; an empty one or one on another path is not.
        for label in [AnswerLabel.plainText, .none, .page] {
            #expect(
                ForeignAnswer.recognise(status: 200, label: label, location: nil, jsonPath: true)
                    == .captivePortal(status: 200))
        }
        #expect(ForeignAnswer.recognise(status: 200, label: .plainText, location: nil, jsonPath: false) == nil)
        #expect(ForeignAnswer.recognise(status: 200, label: .none, location: nil, jsonPath: true, empty: true) == nil)
        #expect(ForeignAnswer.recognise(status: 204, label: .none, location: nil, jsonPath: true) == nil)
        #expect(ForeignAnswer.recognise(status: 200, label: .other, location: nil, jsonPath: true) == nil)
        #expect(ForeignAnswer.recognise(status: 200, label: .json, location: nil, jsonPath: true) == nil)
        // Access's block page through the edge; the server's own JSON refusal passes.
        #expect(
            ForeignAnswer.recognise(status: 403, label: .page, location: nil, edge: true, jsonPath: true)
                == .accessLogin)
        #expect(ForeignAnswer.recognise(status: 401, label: .json, location: nil, edge: true, jsonPath: true) == nil)
        #expect(ForeignAnswer.recognise(status: 403, label: .page, location: nil, edge: false, jsonPath: true) == nil)
        #expect(AnswerLabel(contentType: "Application/XHTML+XML; charset=utf-8") == .page)
        #expect(AnswerLabel(contentType: "text/plain;charset=utf-8") == .plainText)
        #expect(AnswerLabel(contentType: "application/problem+json") == .json)
        #expect(AnswerLabel(contentType: "text/event-stream") == .other)
        #expect(AnswerLabel(contentType: nil) == AnswerLabel.none)
        // Read over the value's bytes: any case, spaces around, parameters, odd values.
        #expect(AnswerLabel(contentType: " TEXT/HTML ; charset=utf-8") == .page)
        #expect(AnswerLabel(contentType: "\tApplication/JSON") == .json)
        #expect(AnswerLabel(contentType: "application/+json") == .json)
        #expect(AnswerLabel(contentType: "application/json-seq") == .other)
        #expect(AnswerLabel(contentType: "text/htmlx") == .other)
        #expect(AnswerLabel(contentType: "  ; charset=utf-8") == AnswerLabel.none)
        #expect(AnswerLabel(contentType: "") == AnswerLabel.none)
        // A list in one value, or a second Content-Type (`then`): a page anywhere is the page;
        // text that is no JSON beside JSON is that text; JSON twice, or beside nothing, is JSON.
        #expect(AnswerLabel(contentType: "text/html, application/json") == .page)
        #expect(AnswerLabel(contentType: "application/json, text/html; charset=utf-8") == .page)
        #expect(AnswerLabel(contentType: "application/json,text/plain") == .plainText)
        #expect(AnswerLabel(contentType: "application/json, application/json") == .json)
        #expect(AnswerLabel(contentType: "application/json,") == .json)
        #expect(AnswerLabel(contentType: ",,") == AnswerLabel.none)
        #expect(AnswerLabel.json.then(.page) == .page && AnswerLabel.page.then(.json) == .page)
        #expect(AnswerLabel.json.then(.plainText) == .plainText && AnswerLabel.plainText.then(.json) == .plainText)
        #expect(AnswerLabel.json.then(.none) == .json && AnswerLabel.other.then(.json) == .other)
        #expect(AnswerLabel(contentType: "tëxt/html") == .other)
        let raw: [UInt8] = [0x74, 0x65, 0x78, 0x74, 0x2F, 0x68, 0x74, 0x6D, 0x6C, 0xFF]
        #expect(raw.withUnsafeBytes { AnswerLabel(mediaType: $0) } == .other)
        #expect(Array("Text/Plain".utf8).withUnsafeBytes { AnswerLabel(mediaType: $0) } == .plainText)
        // What a probe's GET /v1/models says of who answered: only the server's JSON clears a
        // finding, and a redirect, even labelled JSON, is no model list.
        func judge(_ status: Int, _ type: String?, location: String? = nil) -> ForeignAnswer.APIJudgement {
            ForeignAnswer.judgeAPI(
                status: status, contentType: type, location: location, edge: false, server: "http://10.0.0.2:1234",
                empty: false)
        }
        #expect(judge(200, "application/json") == .server)
        #expect(judge(401, "application/json") == .server)
        #expect(judge(302, "application/json") == .unclear)
        #expect(judge(200, "text/plain") == .foreign(.captivePortal(status: 200)))
        #expect(judge(302, "text/html", location: "http://portal.example/") == .foreign(.captivePortal(status: 302)))
        for path in [
            "/v1/chat/completions", "/v1/models", "/v1/models/m", "/v1/agents/runs/1/events", "/v1/messages?x=1",
            "/v1/models#top", "/v1/rag", "/v1/discovery",
        ] {
            #expect(ForeignAnswer.answersInJSON(path: path), "\(path)")
        }
        for path in [
            "/v1/audio/transcriptions", "/v1/modelsx", "/admin/models", "/v1/skills/x", "/v1/", "", "/v1", "/V1/models",
            "/v1/Models", "/v1?/models", "/x/v1/models", "/v1/ragged",
        ] {
            #expect(!ForeignAnswer.answersInJSON(path: path), "\(path)")
        }
        // 511 Network Authentication Required (RFC 6585 §6): the status a captive portal is
        // meant to answer with, whatever its page's type; never an LMX server's.
        #expect(ForeignAnswer.recognise(status: 511, html: true, location: nil) == .captivePortal(status: 511))
        #expect(ForeignAnswer.recognise(status: 511, html: false, location: nil) == .captivePortal(status: 511))
        // Cloudflare's 524: the edge reached the server and waited 100 s for an answer (a long
        // generation not streamed): the server is busy, not gone; the route is not marked.
        #expect(!ForeignAnswer.tunnelErrorPage(status: 524).marksRoute)
        #expect(ForeignAnswer.tunnelErrorPage(status: 524).answer.message.contains("stream"))
        #expect(ForeignAnswer.tunnelErrorPage(status: 530).marksRoute)
        #expect(ForeignAnswer.accessLogin.marksRoute)
        #expect(ForeignAnswer.accessLogin.answer.message.contains("lmx-pair"))
        #expect(ForeignAnswer.accessLogin.verdict == .authRejected)
    }

    @Test(
        "a login page goes to the next route as never sent, even for a POST; an edge's error page only for what may be repeated; alone, the gateway's error"
    )
    func exchange() {
        var post = GatewayExchange(method: "POST", declaredLength: 2, maxBodyBytes: 100, readAheadBytes: 64)
        _ = post.bodyPart(size: 2) { true }
        _ = post.bodyEnd()
        _ = post.routed(routes: 2)
        post.sent(onKeptConnection: false)
        #expect(
            post.answerHead(busyFor: nil, status: 302, stream: false, foreign: .accessLogin)
                == .connect(attempt: 1, fresh: false))
        post.sent(onKeptConnection: false)
        #expect(
            post.answerHead(busyFor: nil, status: 530, stream: false, foreign: .tunnelErrorPage(status: 530))
                == .respond(.notTheServer(.tunnelErrorPage(status: 530))))

        var edge = GatewayExchange(method: "POST", declaredLength: 0, maxBodyBytes: 100, readAheadBytes: 64)
        _ = edge.bodyEnd()
        _ = edge.routed(routes: 2)
        edge.sent(onKeptConnection: false)
        #expect(
            edge.answerHead(busyFor: nil, status: 524, stream: false, foreign: .tunnelErrorPage(status: 524))
                == .respond(.notTheServer(.tunnelErrorPage(status: 524))), "a POST the server may have seen")

        var get = GatewayExchange(method: "GET", declaredLength: 0, maxBodyBytes: 100, readAheadBytes: 64)
        _ = get.bodyEnd()
        _ = get.routed(routes: 2)
        get.sent(onKeptConnection: false)
        #expect(
            get.answerHead(busyFor: nil, status: 524, stream: false, foreign: .tunnelErrorPage(status: 524))
                == .connect(attempt: 1, fresh: false))
    }

    @Test(
        "a run's key: the client's when it reaches the server; the gateway's when the client sent none or listed it in Connection; none when empty or doubled"
    )
    func runKeys() {
        #expect(ServerAffinity.runKey(keys: ["k1"], connectionListed: []) == .client)
        #expect(ServerAffinity.runKey(keys: [], connectionListed: []) == .added)
        #expect(ServerAffinity.runKey(keys: ["k1"], connectionListed: ["idempotency-key"]) == .added)
        #expect(ServerAffinity.runKey(keys: ["  "], connectionListed: []) == .none)
        #expect(ServerAffinity.runKey(keys: ["a", "b"], connectionListed: []) == .none)
    }
}
