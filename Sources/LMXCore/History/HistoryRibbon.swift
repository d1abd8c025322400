/// The history's ribbons as lines of characters (`lmx-status --history`): a time axis, one line
/// per route (its name and path, a cell per stretch of time, the share of the time it was
/// ready), a line marking the switches, and the legend; `width` columns at most (80 by default).
///
/// A cell shows the state that held longest in it, time down counted three times (a short
/// outage still shows), in capitals when the route was in use: `#` in use and ready, `%` in use
/// but not ready, `X` in use and down; `=` ready, `~` not ready, `x` down, `?` not probed yet,
/// `.` the agent was not running, blank where the route was not known.
public enum HistoryRibbon {
    static let labelWidth = 20
    static let shareWidth = 6

    public static func render(_ history: StatusAPI.History, width: Int = 80) -> [String] {
        guard let since = Timestamp.parse(history.since), let until = Timestamp.parse(history.until), until > since
        else { return ["no history in this window"] }
        // Half-hours over a day on an 80-column terminal; fewer cells on a narrower one.
        let cells = width >= labelWidth + 2 + shareWidth + 48 ? 48 : max(12, width - labelWidth - 1 - shareWidth)
        let cell = (until - since) / Double(cells)
        var lines = [axis(since: since, until: until, cells: cells)]
        if history.routes.isEmpty { lines.append("  (no route known in this window)") }
        for route in history.routes {
            let segments = route.segments.compactMap { s -> (Double, Double, StatusAPI.HistorySegment)? in
                guard let from = Timestamp.parse(s.from), let to = Timestamp.parse(s.to) else { return nil }
                return (from, to, s)
            }
            var row = ""
            for index in 0..<cells {
                let start = since + Double(index) * cell
                let end = start + cell
                var weights: [Character: Double] = [:]
                for (from, to, segment) in segments {
                    let overlap = min(to, end) - max(from, start)
                    guard overlap > 0 else { continue }
                    weights[character(segment.state, active: segment.active), default: 0] +=
                        overlap * (segment.state == .down ? 3 : 1)
                }
                row.append(weights.max { a, b in (a.value, a.key) < (b.value, b.key) }?.key ?? " ")
            }
            var readyTime = 0.0
            var known = 0.0
            for (from, to, segment) in segments where segment.state != .stopped {
                known += to - from
                if segment.state == .ready { readyTime += to - from }
            }
            let share = known > 0 ? "\(Int((readyTime / known * 100).rounded(.down)))%" : "-"
            let label = ServerTable.printable(route.name) + (route.via == .wan ? " tunnel" : " LAN")
            lines.append(
                fit(label, labelWidth) + " " + row + " "
                    + String(repeating: " ", count: max(0, shareWidth - 1 - share.count)) + share)
        }
        var marks = Array(repeating: Character(" "), count: cells)
        var count = 0
        for change in history.switches {
            guard let at = Timestamp.parse(change.at), at >= since, at <= until else { continue }
            marks[min(cells - 1, Int((at - since) / cell))] = "^"
            count += 1
        }
        lines.append(fit("switches: \(count)", labelWidth) + " " + String(marks))
        lines.append("# in use  = ready  ~ not ready  x down  ? not probed  . agent off  ^ switch")
        return lines.map { String($0.reversed().drop(while: { $0 == " " }).reversed()) }
    }

    /// The character of a cell (see the type's summary).
    public static func character(_ state: RibbonState, active: Bool) -> Character {
        guard active else { return state.character }
        switch state {
        case .ready: return "#"
        case .notReady: return "%"
        case .down: return "X"
        case .unknown, .stopped: return state.character
        }
    }

    /// `-24h … -18h … now` over the cells, under the label column's heading.
    static func axis(since: Double, until: Double, cells: Int) -> String {
        var line = Array(String(repeating: " ", count: labelWidth + 1))
        var axis = Array(repeating: Character(" "), count: cells)
        for quarter in 0..<4 {
            let label = Array("-" + duration((until - since) * Double(4 - quarter) / 4))
            let at = cells * quarter / 4
            for (offset, c) in label.enumerated() where at + offset < cells { axis[at + offset] = c }
        }
        let now = Array("now")
        for (offset, c) in now.enumerated() { axis[cells - now.count + offset] = c }
        line += axis
        return String(line) + " ready"
    }

    /// `90m`, `6h`, `1.5d`: a span in its largest whole-ish unit.
    static func duration(_ seconds: Double) -> String {
        func number(_ v: Double) -> String {
            v == v.rounded() ? "\(Int(v))" : "\((v * 10).rounded() / 10)"
        }
        if seconds >= 2 * 86_400 { return number(seconds / 86_400) + "d" }
        if seconds >= 2 * 3600 { return number(seconds / 3600) + "h" }
        if seconds >= 120 { return number((seconds / 60).rounded()) + "m" }
        return number(seconds.rounded()) + "s"
    }

    /// `text` in exactly `width` terminal columns: cut with `…` or padded with spaces.
    static func fit(_ text: String, _ width: Int) -> String {
        var out = ""
        var used = 0
        for character in text {
            let wide = columns(String(character))
            if used + wide > width - 1 && columns(text) > width {
                return out + "…" + String(repeating: " ", count: max(0, width - 1 - used))
            }
            out.append(character)
            used += wide
        }
        return out + String(repeating: " ", count: max(0, width - used))
    }

    /// The columns `text` takes on a terminal: East Asian wide characters and emoji two, combining
    /// marks and format characters none, anything else one (a server's name may be any of them).
    public static func columns(_ text: String) -> Int {
        var total = 0
        for scalar in text.unicodeScalars {
            let v = scalar.value
            switch scalar.properties.generalCategory {
            case .nonspacingMark, .enclosingMark, .format: continue
            default: break
            }
            if (0xFE00...0xFE0F).contains(v) { continue }
            let wide =
                scalar.properties.isEmojiPresentation || (0x1100...0x115F).contains(v) || (0x2E80...0xA4CF).contains(v)
                || (0xAC00...0xD7A3).contains(v) || (0xF900...0xFAFF).contains(v) || (0xFE30...0xFE4F).contains(v)
                || (0xFF00...0xFF60).contains(v) || (0xFFE0...0xFFE6).contains(v) || (0x20000...0x3FFFD).contains(v)
            total += wide ? 2 : 1
        }
        return total
    }
}
