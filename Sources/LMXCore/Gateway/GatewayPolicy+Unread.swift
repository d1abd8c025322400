extension GatewayPolicy {
    /// The answer to a request under `/v1/` or `/admin/` that the policy lets through but the
    /// data path did not read (SwiftNIO's llhttp read it for the general path, which forwards
    /// nothing): a body in a transfer coding other than `chunked`, a chunked body from an
    /// HTTP/1.0 client, a target that is not origin-form visible ASCII, a header line of control
    /// bytes, more than 100 headers. Said in words a client's author can act on.
    /// - Parameters:
    ///   - headers: the request's headers, as llhttp read them;
    ///   - lines: how many header lines came (Hummingbird keeps `Host` apart from the headers).
    public static func unreadRefusal(headers: [(name: String, value: String)], lines: Int? = nil) -> Refusal {
        let codings = headers.filter { $0.name.equalsASCIILowercased("transfer-encoding") }.map(\.value)
        if !codings.isEmpty {
            let plainChunked = codings.count == 1 && codings[0].equalsASCIILowercased("chunked")
            if !plainChunked {
                return Refusal(
                    status: 501, code: "transfer_coding_unsupported",
                    message:
                        "the gateway reads request bodies sent with Content-Length, or with Transfer-Encoding: chunked alone over HTTP/1.1"
                )
            }
        }
        if (lines ?? headers.count) > maxRequestHeaders {
            return Refusal(
                status: 431, code: "too_many_headers",
                message: "the request has more than \(maxRequestHeaders) header lines; send fewer")
        }
        return Refusal(
            status: 400, code: "bad_request",
            message:
                "the gateway forwards plain HTTP/1.1 requests: a target of a path and query in printable ASCII (percent-encode the rest), header lines without control characters"
        )
    }

    /// The answer to a request llhttp could not read at all. (Which rule it broke is not named:
    /// llhttp's error codes say where it stopped, not why, and a wrong cause misleads more than
    /// the list of what it reads.)
    public static let unreadableRefusal = Refusal(
        status: 400, code: "bad_request",
        message:
            "the gateway could not read the request as HTTP/1.1: end each line with CRLF, send header names and values without control characters, and frame a body with one Content-Length or with Transfer-Encoding: chunked alone"
    )

    /// The answer to a head longer than the gateway reads (`limit` bytes).
    public static func headTooLarge(limit: Int) -> Refusal {
        Refusal(
            status: 431, code: "head_too_large",
            message:
                "the request's head (its request line and headers) is longer than the gateway reads (\(limit / 1024) KiB); send fewer or shorter headers"
        )
    }

    /// The most header lines a request forwarded may have.
    public static let maxRequestHeaders = 100
}
