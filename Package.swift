// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "lmx-agent",
    platforms: [.macOS(.v14)],
    products: [
        .library(name: "LMXCore", targets: ["LMXCore"]),
        .library(name: "LMXDiscovery", targets: ["LMXDiscovery"]),
        .executable(name: "lmx-discover", targets: ["lmx-discover"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
    ],
    targets: [
        // Pure core: domain types, TXT parsing, record merging, output formats. No C, no I/O.
        .target(name: "LMXCore"),

        // Thin module map over libavahi-client (D-Bus client of the system avahi-daemon).
        .systemLibrary(
            name: "CAvahi",
            pkgConfig: "avahi-client",
            providers: [.apt(["libavahi-client-dev"])]
        ),

        // Adapter: browses and resolves through avahi-daemon, yields core events.
        .target(name: "LMXDiscovery", dependencies: ["LMXCore", "CAvahi"]),

        .executableTarget(
            name: "lmx-discover",
            dependencies: [
                "LMXCore",
                "LMXDiscovery",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),

        .testTarget(name: "LMXCoreTests", dependencies: ["LMXCore"]),
        .testTarget(name: "DiscoveryIntegrationTests", dependencies: ["LMXCore"]),
    ],
    swiftLanguageModes: [.v6]
)
