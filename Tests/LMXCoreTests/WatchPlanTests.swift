import LMXCore
import Testing

/// A file system as a table: path → what is there.
private func lookup(_ table: [String: WatchPlan.Entry]) -> (String) -> WatchPlan.Entry {
    { table[$0] ?? .missing }
}

@Suite("WatchPlan: what to watch so that a named file is followed by its name")
struct WatchPlanTests {
    @Test("every folder on the way is watched for the next name, the last one for the file")
    func plainPath() {
        let plan = WatchPlan(
            paths: ["/home/u/opta/book.json"],
            lookup: lookup([
                "/home": .directory, "/home/u": .directory, "/home/u/opta": .directory,
                "/home/u/opta/book.json": .other,
            ]))
        #expect(
            plan.directories == ["/": ["home"], "/home": ["u"], "/home/u": ["opta"], "/home/u/opta": ["book.json"]])
        #expect(plan.matters("/home/u/opta/book.json"))
        #expect(plan.matters("/home/u/opta"))
        #expect(!plan.matters("/home/u/.bash_history"))
        #expect(!plan.matters("/home/u/opta/other.json"))
    }

    @Test("a folder not made yet: the walk stops at the nearest folder there, watched for its name")
    func missingFolder() {
        let plan = WatchPlan(
            paths: ["/home/u/later/deeper/book.json"], lookup: lookup(["/home": .directory, "/home/u": .directory]))
        #expect(plan.directories == ["/": ["home"], "/home": ["u"], "/home/u": ["later"]])
        #expect(plan.matters("/home/u/later"))
    }

    @Test("links are followed, the link's folder and the target's both watched; relative and absolute targets")
    func links() {
        let table: [String: WatchPlan.Entry] = [
            "/etc": .directory, "/etc/lmx": .symbolicLink("/srv/current"), "/srv": .directory,
            "/srv/current": .symbolicLink("v2"), "/srv/v2": .directory,
            "/srv/v2/book.json": .symbolicLink("../shared/b.json"),
            "/srv/shared": .directory, "/srv/shared/b.json": .other,
        ]
        let plan = WatchPlan(paths: ["/etc/lmx/book.json"], lookup: lookup(table))
        #expect(
            plan.directories == [
                "/": ["etc", "srv"], "/etc": ["lmx"], "/srv": ["current", "v2", "shared"], "/srv/v2": ["book.json"],
                "/srv/shared": ["b.json"],
            ])
        // Retargeting any link on the way, or rewriting the file it ends at, matters.
        #expect(plan.matters("/etc/lmx") && plan.matters("/srv/current") && plan.matters("/srv/shared/b.json"))
    }

    @Test("a link loop ends after 40 links, the names seen so far watched")
    func loop() {
        let plan = WatchPlan(
            paths: ["/a/b"], lookup: lookup(["/a": .directory, "/a/b": .symbolicLink("c"), "/a/c": .symbolicLink("b")]))
        #expect(plan.directories == ["/": ["a"], "/a": ["b", "c"]])
    }

    @Test("several paths share folders; relative paths start at the working directory; . and .. are walked")
    func several() {
        let plan = WatchPlan(
            paths: ["/x/a.json", "/x/b.json", "books/c.json", "/x/../y/./d.json"],
            lookup: lookup(["/x": .directory, "/y": .directory, "./books": .directory]))
        #expect(
            plan.directories == [
                "/": ["x", "y"], "/x": ["a.json", "b.json"], ".": ["books"], "./books": ["c.json"], "/y": ["d.json"],
            ])
    }
}

@Suite("PendingChanges")
struct PendingChangesTests {
    @Test("10,000 changes while one is handled wait as one bounded set; any past the limit stand for all")
    func bounded() {
        var pending = PendingChanges()
        for index in 0..<10_000 { pending.add(["/tmp/name-\(index)"]) }
        #expect(pending.paths == [PendingChanges.everything])
        let taken = pending.take()
        #expect(taken.paths == [PendingChanges.everything])
        #expect(pending.isEmpty)
    }

    @Test("repeated changes to one name fold into one; a reread is kept beside them until taken")
    func folds() {
        var pending = PendingChanges()
        for _ in 0..<1000 { pending.add(["/tmp/book", "/tmp"]) }
        pending.requestReread()
        #expect(pending.paths == ["/tmp/book", "/tmp"])
        let taken = pending.take()
        #expect(taken.reread && taken.paths.count == 2)
        #expect(pending.isEmpty && !pending.reread)
    }
}
