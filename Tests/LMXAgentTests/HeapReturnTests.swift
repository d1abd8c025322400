import Testing

@testable import LMXAgent

@Suite("Heap return: memory freed without answers")
struct HeapReturnFreedTests {
    private static let mib = 1 << 20

    @Test("given back once a MiB more of freed memory is resident, though nothing was answered; once")
    func freedWithoutAnswers() {
        var schedule = HeapReturnSchedule()
        // Connections hold memory (nothing freed), close (7 MiB freed, resident), the return
        // gives 6 back, then small changes; later 2 MiB more freed.
        let looks = [2, 2, 9, 3, 3, 3.5, 5]
        let due = looks.map { schedule.due(answers: 0, freed: Int($0 * Double(Self.mib))) }
        #expect(due == [false, false, true, false, false, false, true])
    }

    @Test("what a return could not give back is not asked for again")
    func notRepeated() {
        var schedule = HeapReturnSchedule()
        let due = [2, 9, 9, 9, 9].map { schedule.due(answers: 0, freed: $0 * Self.mib) }
        #expect(due == [false, true, false, false, false])
    }

    @Test("not while answers keep coming, however much was freed; at the first quiet look")
    func waitsForQuiet() {
        var schedule = HeapReturnSchedule()
        let looks = [(1, 2), (2, 9), (3, 9), (3, 9), (3, 2)]
        let due = looks.map { schedule.due(answers: $0.0, freed: $0.1 * Self.mib) }
        #expect(due == [false, false, false, true, false])
    }
}
