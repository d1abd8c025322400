import Foundation
import LMXImage
import Subprocess
import SystemPackage
import Testing

@testable import LMXCore

private let repo = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()

/// One mutation of `seed`: flipped bytes, a cut, an inserted or repeated run, or a header
/// field (PNG IHDR width/height, JPEG SOF size) set to an extreme.
private func mutate(_ seed: [UInt8], _ rng: inout SplitMix64) -> [UInt8] {
    var bytes = seed
    switch Int.random(in: 0..<6, using: &rng) {
    case 0:
        for _ in 0..<Int.random(in: 1...8, using: &rng) {
            bytes[Int.random(in: 0..<bytes.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
        }
    case 1:
        bytes = Array(bytes.prefix(Int.random(in: 0..<bytes.count, using: &rng)))
    case 2:
        let at = Int.random(in: 0...bytes.count, using: &rng)
        bytes.insert(
            contentsOf: (0..<Int.random(in: 1...64, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) },
            at: at)
    case 3:
        let start = Int.random(in: 0..<bytes.count, using: &rng)
        let run = bytes[start..<min(bytes.count, start + Int.random(in: 1...512, using: &rng))]
        bytes.insert(contentsOf: run, at: Int.random(in: 0...bytes.count, using: &rng))
    case 4:
        // Sizes in the header: PNG IHDR at 16..<24, JPEG SOF0/SOF2 height/width after the marker.
        let extreme: [UInt8] = [[0, 0, 0, 0], [0xFF, 0xFF, 0xFF, 0xFF], [0x7F, 0xFF, 0xFF, 0xFF], [0, 0, 0x40, 0]]
            .randomElement(using: &rng)!
        if bytes.starts(with: [0x89, 0x50]) && bytes.count > 24 {
            let field = Bool.random(using: &rng) ? 16 : 20
            bytes.replaceSubrange(field..<field + 4, with: extreme)
        } else if let sof = (0..<bytes.count - 9).first(where: {
            bytes[$0] == 0xFF && (bytes[$0 + 1] == 0xC0 || bytes[$0 + 1] == 0xC2)
        }) {
            bytes.replaceSubrange(sof + 5..<sof + 9, with: extreme)
        }
    default:
        for _ in 0..<Int.random(in: 1...4, using: &rng) {
            let i = Int.random(in: 0..<bytes.count, using: &rng)
            bytes[i] ^= 1 << UInt8.random(in: 0...7, using: &rng)
        }
    }
    return bytes
}

@Suite("Mutated images: the decoders never crash")
struct ImageFuzzTests {
    @Test("10,000 mutated PNG and JPEG pairing codes: each decodes or is refused with an error, none crashes")
    func fuzz() async throws {
        var seeds: [[UInt8]] = []
        for name in ["v1-token.png", "tunnel-url.png", "connect-link.png"] {
            seeds.append(Array(try Data(contentsOf: repo.appendingPathComponent("examples/pairing/" + name))))
        }
        // A JPEG of the same code, made by the encoder the tests already use (ImageMagick).
        let jpeg = FileManager.default.temporaryDirectory.appendingPathComponent("lmx-fuzz-\(getpid()).jpg")
        let convert = try await Subprocess.run(
            .path("/usr/bin/convert"),
            arguments: [
                repo.appendingPathComponent("examples/pairing/v1-token.png").path, "-quality", "80", jpeg.path,
            ],
            output: .discarded, error: .string(limit: 64 * 1024))
        #expect(
            convert.terminationStatus.isSuccess,
            "ImageMagick's convert is needed (make test installs it): \(convert.standardError)")
        if let bytes = try? Data(contentsOf: jpeg) { seeds.append(Array(bytes)) }
        try? FileManager.default.removeItem(at: jpeg)
        #expect(seeds.count == 4)
        for seed in seeds { #expect(!(try QRScanner.scan(try ImageDecoder.decode(seed))).isEmpty) }

        var rng = SplitMix64(seed: 0x1A2B_3C4D)
        var decoded = 0
        var refused = 0
        var stillReadable = 0
        for i in 0..<10_000 {
            let input = mutate(seeds[i % seeds.count], &rng)
            do {
                let image = try ImageDecoder.decode(input)
                decoded += 1
                if !((try? QRScanner.scan(image)) ?? []).isEmpty { stillReadable += 1 }
            } catch {
                refused += 1
                #expect(!error.description.isEmpty)
            }
        }
        print(
            "figure: 10,000 mutated images: \(decoded) decoded (\(stillReadable) still readable), \(refused) refused, 0 crashes"
        )
        // The mutations reach past the header checks: some still decode, some are refused.
        #expect(decoded > 0 && refused > 0)
    }
}
