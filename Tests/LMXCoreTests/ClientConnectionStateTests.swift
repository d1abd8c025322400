import Testing

@testable import LMXCore

/// The rules of a gateway client connection's life around its exchanges, without a channel.
@Suite("Client connection: pipelining, hand-overs, quiescing, closing")
struct ClientConnectionStateTests {
    @Test("pipelining: the next request waits while the one before it awaits its answer, ours or the general path's")
    func pipelining() {
        var life = ClientConnectionState()
        #expect(!life.queues(.none, alreadyQueued: false))
        #expect(!life.queues(.reading, alreadyQueued: false), "the body in progress is handled as it comes")
        #expect(life.queues(.answering, alreadyQueued: false))
        #expect(life.queues(.finished, alreadyQueued: false))
        #expect(life.queues(.none, alreadyQueued: true), "in order behind what waits")
        // A request handed to the general path: while llhttp reads it, its parts pass; once it
        // has all come, the next request waits for its answer.
        life.generalPathHead()
        #expect(!life.takesRequests && !life.waitsForGeneralPath(.none) && life.midRequest(.none))
        life.generalPathEnd()
        #expect(life.waitsForGeneralPath(.none) && life.queues(.none, alreadyQueued: false))
        let nowIdle = life.generalPathAnswered(.none)
        #expect(nowIdle, "idle once its answer ended")
        #expect(life.takesRequests && !life.queues(.none, alreadyQueued: false))
        // Handed over with part of its body: the rest goes to llhttp as it comes.
        life.handedToLLHTTP(ended: false)
        #expect(life.midRequest(.none) && !life.idle(.none))
        life.replayEnded()
        #expect(life.idle(.none))
        // llhttp reads the rest of the connection: nothing more is decided here, nor queued.
        life.llhttpTakesRest()
        life.generalPathHead()
        life.generalPathEnd()
        #expect(!life.takesRequests && !life.waitsForGeneralPath(.none))
    }

    @Test("quiescing: in-progress work finishes, then the connection closes; an idle one closes at once")
    func quiescing() {
        var idle = ClientConnectionState()
        let told = idle.stop(quiesce: true)
        #expect(!told, "the general path answers nothing: not told")
        #expect(idle.next(.none, nothingQueued: true) == .close)
        var busy = ClientConnectionState()
        busy.generalPathHead()
        let busyTold = busy.stop(quiesce: true)
        #expect(busyTold, "the general path answers a request: told")
        busy.generalPathEnd()
        #expect(busy.next(.none, nothingQueued: true) == .none)
        let answered = busy.generalPathAnswered(.none)
        #expect(answered)
        #expect(busy.next(.none, nothingQueued: true) == .close)
        var ours = ClientConnectionState()
        _ = ours.stop(quiesce: true)
        #expect(ours.next(.answering, nothingQueued: true) == .none)
        #expect(ours.next(.none, nothingQueued: false) == .none, "queued requests are answered first")
        #expect(ours.next(.none, nothingQueued: true) == .close)
    }

    @Test("the client ends its side: a body in progress can never end (refused); an awaited answer still goes")
    func inputClosed() {
        var life = ClientConnectionState()
        _ = life.stop(quiesce: false)
        #expect(life.inputClosed && life.closeWhenIdle)
        #expect(life.next(.reading, nothingQueued: true) == .refuseIncompleteBody)
        #expect(life.next(.reading, nothingQueued: false) == .none, "a queued request's end may still come")
        #expect(life.next(.answering, nothingQueued: true) == .none)
        #expect(life.next(.none, nothingQueued: true) == .close)
    }

    @Test(
        "a connection that ends while an answer is awaited: its client left, counted once; the gateway's own close is not"
    )
    func clientLeft() {
        var waiting = ClientConnectionState()
        let early = waiting.ended(.reading)
        #expect(!early, "no answer awaited yet")
        let left = waiting.ended(.answering)
        let again = waiting.ended(.answering)
        #expect(left && !again, "once")
        var handed = ClientConnectionState()
        handed.generalPathHead()
        let handedLeft = handed.ended(.none)
        #expect(handedLeft)
        var closedByUs = ClientConnectionState()
        closedByUs.closedByGateway()
        let ours = closedByUs.ended(.answering)
        #expect(!ours)
        #expect(closedByUs.busy(.reading) && !closedByUs.busy(.none))
    }
}
