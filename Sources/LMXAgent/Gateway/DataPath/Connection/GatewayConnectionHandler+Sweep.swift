import LMXCore
import LMXProbe
import LMXSystem
import NIOCore
import NIOHTTP1
import Prometheus

extension GatewayConnectionHandler {
    /// The client closed its side while a request of ours waits for (or streams) its answer. A
    /// client that has closed its whole connection (an SDK's timeout, Ctrl-C, a process that
    /// ended) and one that has only ended its side (`shutdown(SHUT_WR)`, still reading) look the
    /// same on the connection until something is written to it. On a Unix socket the kernel
    /// tells them apart (a whole close hangs the connection up, and SwiftNIO closes it); on a TCP
    /// connection from this machine the client's own socket does, in the kernel's tables: one
    /// its process has closed is held by no file. A client that has left has its request cut at
    /// the server, which stops working on it (nginx cuts it on either close); one that only
    /// ended its side gets its answer. The client's socket is looked at again a moment later
    /// when it seemed held: its FIN can come before its process has quite let go of it.
    func cutIfClientLeft(lookAgain: Bool) {
        // A request of ours whose body has all come, or one handed over to the general path
        // (closing the connection cancels its task, and with it the request to the server).
        let awaited = exchange.map(\.request.clientEnded) ?? (life.handedOver > 0)
        guard awaited, overTCP, let channel = context?.channel,
            let local = channel.localAddress?.bytesAndPort, let remote = channel.remoteAddress?.bytesAndPort
        else { return }
        switch SocketOwner.peerSocket(peer: remote, local: local) {
        case .closed:
            break
        case .absent where SocketOwner.isLoopback(remote.address):
            break  // a loopback peer's socket is on this machine: gone
        case .held where lookAgain:
            let current = exchange
            context?.eventLoop.assumeIsolated().scheduleTask(in: .milliseconds(100)) { [self] in
                if self.exchange === current { self.cutIfClientLeft(lookAgain: false) }
            }
            return
        case .held, .absent, .unknown:
            return
        }
        gateway.metrics.gatewayClientsLeft.increment()
        gateway.logger.info(
            "gateway: a client closed its connection before its answer ended; the request to the server is cut")
        closeConnection()
    }

    /// The connection ended, or failed, without the gateway closing it: if an answer was awaited
    /// (a request of ours whose body had all come, or one handed over), its client left — a Unix
    /// socket's client hung up, a TCP client reset its connection. Counted as
    /// ``cutIfClientLeft(lookAgain:)`` counts a TCP client's close (the request to the server is cut
    /// as the connection goes: ``abandon()``).
    func countIfClientLeft() {
        guard life.ended(exchangeNow) else { return }
        gateway.metrics.gatewayClientsLeft.increment()
        gateway.logger.info(
            "gateway: a client's connection ended before its answer did; the request to the server is cut")
    }

    /// The loop's sweep looks at the connection after `delay` (one timer for the loop's
    /// connections, not one per connection or per request): ``sweepDue()``.
    func checkAgain(in delay: TimeAmount? = nil) {
        nextCheck = .now() + (delay ?? clientTimeout)
    }

    func leaveSweep() {
        guard let sweepSlot else { return }
        self.sweepSlot = nil
        state.sweep.remove(sweepSlot)
    }

    /// Closes the connection when it has been idle for the whole timeout, else looks again at the
    /// rest of it; answers 408 when the body of the request in progress has not moved for a whole
    /// period though it was being read (reads held for the server's sake do not count against the
    /// client).
    func sweepDue() {
        guard context != nil else { return leaveSweep() }
        let busy = life.busy(exchangeNow)
        let deadline = idleSince + clientTimeout
        if !busy, deadline <= .now() {
            closeConnection()
            return
        }
        // In the middle of a request (ours, or one llhttp reads for the general path), waiting
        // for the client's bytes (as nginx's `client_body_timeout`).
        let midRequest = life.midRequest(exchangeNow)
        if midRequest, readAsked, let read = front?.bytesRead {
            if let bytesSeen, bytesSeen == read {
                gateway.logger.info(
                    "gateway: a client sent nothing of its request for gateway.client_timeout; its connection is closed"
                )
                if let exchange, !exchange.request.clientEnded {
                    exchange.bodyNotWhole(.timeout(seconds: Int(clientTimeout.nanoseconds / 1_000_000_000)))
                    // An exchange that cannot answer it any more (its server's answer already
                    // begun, or held until the body's end) leaves the connection to be closed.
                    if self.exchange !== exchange || context == nil { return }
                }
                closeConnection()
                return
            }
            bytesSeen = read
        } else {
            bytesSeen = nil
        }
        if let request = exchange?.request, request.phase == .answering, !request.machine.holdsAnswer, !clientWritable {
            // The client takes nothing of its answer (as nginx's `send_timeout`): the server's
            // connection is not held for it any longer.
            if let answerSeen, answerSeen == answerBytesWritten {
                gateway.logger.info(
                    "gateway: a client took nothing of its answer for gateway.client_timeout; its connection is closed")
                closeConnection()
                return
            }
            answerSeen = answerBytesWritten
        } else {
            answerSeen = nil
        }
        checkAgain(in: busy ? clientTimeout : deadline - .now())
    }
}
