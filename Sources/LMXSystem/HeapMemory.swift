import CLinux

/// The process's heap as glibc's allocator keeps it. Memory a burst of large requests used and then
/// freed stays resident in the allocator's arenas (free chunks between ones in use, on each thread
/// that allocated), which glibc gives back by itself only at the top of a heap; `malloc_trim`
/// gives back every whole free page.
public enum HeapMemory {
    /// Gives the pages of freed heap memory back to the kernel (`malloc_trim(0)`); true when any
    /// were. Safe at any time: the allocator locks each arena while it looks.
    @discardableResult
    public static func returnFreePages() -> Bool { malloc_trim(0) == 1 }

    /// Limits glibc's allocator to `count` heaps (arenas; `mallopt(M_ARENA_MAX)`). By default it
    /// makes up to eight per core, one for each thread that allocates while the others' are busy,
    /// and each holds its own freed memory resident. Call before starting threads; true when set.
    @discardableResult
    public static func limitArenas(_ count: Int) -> Bool {
        lmx_limit_malloc_arenas(Int32(clamping: count)) == 1
    }

    /// The bytes the allocator has handed out and not had back (`mallinfo2`'s `uordblks` and
    /// `hblkhd`): what the process uses, apart from what it freed and the allocator still holds.
    public static func allocatedBytes() -> Int { Int(clamping: lmx_malloc_in_use()) }

    /// Anonymous resident memory beyond what the allocator has handed out, bytes: mostly memory
    /// freed and still held (plus a steady part: relocated data, thread stacks); nil when
    /// /proc/self/status cannot be read.
    public static func residentBeyondAllocatedBytes() -> Int? {
        anonymousResidentKiB().map { $0 * 1024 - allocatedBytes() }
    }

    /// The process's anonymous resident memory (`RssAnon` of /proc/self/status), KiB; nil when
    /// it cannot be read.
    public static func anonymousResidentKiB() -> Int? {
        guard let bytes = try? FileSystem.read("/proc/self/status", limit: 64 * 1024) else { return nil }
        return statusField("RssAnon", in: bytes)
    }

    /// A `Name:   123 kB` field of a /proc status file, in its unit (KiB); nil when absent or not
    /// a number.
    public static func statusField(_ name: String, in bytes: [UInt8]) -> Int? {
        let prefix = Array(name.utf8) + [UInt8(ascii: ":")]
        var lineStart = 0
        while lineStart < bytes.count {
            let lineEnd = bytes[lineStart...].firstIndex(of: UInt8(ascii: "\n")) ?? bytes.count
            let line = bytes[lineStart..<lineEnd]
            if line.starts(with: prefix) {
                let value = line.dropFirst(prefix.count).drop { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\t") }
                let digits = value.prefix { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }
                guard !digits.isEmpty, digits.count <= 18 else { return nil }
                return digits.reduce(0) { $0 * 10 + Int($1 - UInt8(ascii: "0")) }
            }
            lineStart = lineEnd + 1
        }
        return nil
    }
}
