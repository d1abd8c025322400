// swift-tools-version:6.1
import PackageDescription

/// What the tests launch processes with (the harness, ImageMagick in the image fuzz test).
let processLaunching: [Target.Dependency] = [
    .product(name: "Subprocess", package: "swift-subprocess"),
    .product(name: "SystemPackage", package: "swift-system"),
]

/// lmx-status as a static PIE, in release builds made with LMX_STATIC_STATUS=1 and
/// --disable-local-rpath (scripts/lib.sh): glibc cannot start a static PIE that has a run path,
/// and SwiftPM gives every product one unless told not to.
let staticStatus: [LinkerSetting] =
    Context.environment["LMX_STATIC_STATUS"] == "1"
    ? [
        .unsafeFlags(
            ["-static-executable", "-Xclang-linker", "-static-pie"], .when(platforms: [.linux], configuration: .release)
        )
    ]
    : []

let package = Package(
    name: "lmx-agent",
    platforms: [.macOS(.v14)],
    products: [
        .library(name: "LMXCore", targets: ["LMXCore"]),
        .library(name: "LMXDiscovery", targets: ["LMXDiscovery"]),
        .library(name: "LMXProbe", targets: ["LMXProbe"]),
        .library(name: "LMXStore", targets: ["LMXStore"]),
        .library(name: "LMXAgent", targets: ["LMXAgent"]),
        .library(name: "LMXStatusClient", targets: ["LMXStatusClient"]),
        .library(name: "LMXSystem", targets: ["LMXSystem"]),
        // The commands: one multi-call binary (lmx-agentd, lmx-discover, lmx-pair and lmx-notify are
        // links to it, made by scripts/lib.sh's link_commands and by the package), and lmx-status on
        // its own (a static PIE in release builds: it starts in half the time).
        .executable(name: "lmx-agent", targets: ["lmx-agent"]),
        .executable(name: "lmx-status", targets: ["lmx-status"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.80.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.29.0"),
        // Already Hummingbird's: the HTTP/1 ↔ HTTP types codec, placed after the data path's handler.
        .package(url: "https://github.com/apple/swift-nio-extras", from: "1.34.1"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.25.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.6.0"),
        // No default traits: `FullFoundation` would bring full Foundation and with it ICU (34 MB
        // of data) for form-date formatters the agent never uses; `ConfigurationSupport` brings
        // swift-configuration, which the agent does not use either.
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.10.0", traits: []),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.1.0"),
        .package(url: "https://github.com/apple/swift-system", from: "1.5.0"),
        // Tests only: the harness launches the real binaries, servers and publishers with it.
        .package(url: "https://github.com/swiftlang/swift-subprocess", from: "1.0.0"),
    ],
    targets: [
        // Pure core: domain types, TXT parsing, record merging, health and selection decisions,
        // output formats. No C, no I/O, no clock of its own.
        .target(name: "LMXCore"),

        // The one system layer: clocks, files written atomically, Unix sockets and peer
        // credentials, users and groups, privilege switches, inotify, netlink and route lookups,
        // the clocks' view of a suspend, sd-notify, signals, libraries opened at run time
        // (dlopen). Nothing above it (but the C adapters) imports Glibc.
        .target(name: "LMXSystem", dependencies: ["CLinux", .product(name: "SystemPackage", package: "swift-system")]),

        // The kernel's UAPI structures LMXSystem uses (netlink, rtnetlink, sock_diag, ucred), from
        // linux-libc-dev: headers only, nothing to link.
        .systemLibrary(name: "CLinux"),

        // Thin module map over libdbus-1, and the adapter on it: logind's PrepareForSleep signal
        // on the system bus (the daemon only: the commands do not load libdbus).
        .systemLibrary(name: "CDBus", pkgConfig: "dbus-1", providers: [.apt(["libdbus-1-dev"])]),
        .target(name: "LMXBus", dependencies: ["CDBus", "LMXSystem"]),

        // Thin module map over libavahi-client (D-Bus client of the system avahi-daemon), from
        // libavahi-client-dev. The module map names the libraries; no pkgConfig: avahi-client.pc
        // only adds -D_REENTRANT (meaningless with glibc), which SwiftPM warns about on every build.
        .systemLibrary(name: "CAvahi"),

        // Thin module maps for pairing codes in images: zbar reads QR codes, libpng and
        // libjpeg-turbo (TurboJPEG API) decode images, libqrencode draws codes for export. Headers
        // only (libzbar-dev, libpng-dev, libturbojpeg0-dev, libqrencode-dev): LMXImage opens the
        // libraries when an image is first read or drawn, so lmx-agentd, which shares the
        // multi-call binary, never maps them (nor the X11 and v4l libraries zbar brings).
        .systemLibrary(name: "CZBar"),
        .systemLibrary(name: "CPNG"),
        .systemLibrary(name: "CTurboJPEG"),
        .systemLibrary(name: "CQRencode"),

        // Adapter: images to grey pixels (limits checked from the header), QR codes in and out.
        .target(name: "LMXImage", dependencies: ["LMXCore", "LMXSystem", "CZBar", "CPNG", "CTurboJPEG", "CQRencode"]),

        // Thin module map over glibc's stub resolver (libresolv): unicast DNS questions through
        // /etc/resolv.conf and its message parser, for DNS-SD in unicast domains (wide-area).
        .systemLibrary(name: "CResolv"),

        // Adapter: browses and resolves through avahi-daemon, and in unicast DNS domains; yields
        // core events. Also the doctor's checks (a direct mDNS question per interface).
        .target(name: "LMXDiscovery", dependencies: ["LMXCore", "LMXSystem", "CAvahi", "CResolv"]),

        // Adapter: probes one endpoint over HTTP(S) by the LMX contract.
        .target(
            name: "LMXProbe",
            dependencies: [
                "LMXCore", "LMXSystem",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ]
        ),

        // Thin module map over the system SQLite (libsqlite3-dev).
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),

        // Adapter: the agent's memory in SQLite (the system libsqlite3, through CSQLite).
        .target(name: "LMXStore", dependencies: ["LMXCore", "LMXSystem", "CSQLite"]),

        // Tiny HTTP/1.1 client over the agent's Unix socket; no NIO so `lmx-status` starts fast.
        .target(name: "LMXStatusClient", dependencies: ["LMXCore", "LMXSystem"]),

        // The daemon: connection manager actor, services, the Unix-socket status API.
        .target(
            name: "LMXAgent",
            dependencies: [
                "LMXCore", "LMXDiscovery", "LMXProbe", "LMXStore", "LMXStatusClient", "LMXSystem", "LMXBus",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "NIOHTTPTypesHTTP1", package: "swift-nio-extras"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            // The dashboard's page, script, style and icon, compiled in as byte arrays
            // (`PackageResources`): no bundle to find at run time, no Foundation.
            resources: [.embedInCode("Dashboard/Assets")]
        ),

        // The commands, each a library: one multi-call binary holds them all (the package installs
        // it once, the commands as links to it; the tests and the man pages use the same links).
        .target(
            name: "LMXDiscoverCommand",
            dependencies: [
                "LMXCore", "LMXDiscovery", "LMXProbe", "LMXSystem",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .target(
            name: "LMXAgentdCommand",
            dependencies: [
                "LMXAgent", "LMXCore", "LMXSystem",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(
            name: "LMXStatusCommand",
            dependencies: [
                "LMXCore", "LMXStatusClient", "LMXSystem",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .target(
            name: "LMXPairCommand",
            dependencies: [
                "LMXCore", "LMXImage", "LMXProbe", "LMXStore", "LMXStatusClient", "LMXSystem",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .target(
            name: "LMXNotifyCommand",
            dependencies: [
                "LMXCore", "LMXBus", "LMXStatusClient", "LMXSystem",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        // The release build (LMX_STATIC_STATUS=1, scripts/lib.sh) links it as one static PIE: no
        // dynamic loader, no shared libraries to map and bind, so `lmx-status --url` (what shells
        // and scripts call) starts in about half the time. It needs nothing glibc loads at run
        // time (no NSS look-ups, no DNS).
        .executableTarget(name: "lmx-status", dependencies: ["LMXStatusCommand"], linkerSettings: staticStatus),
        // The multi-call binary: dispatches on the name it was started by (busybox-style).
        .executableTarget(
            name: "lmx-agent",
            dependencies: [
                "LMXAgentdCommand", "LMXStatusCommand", "LMXDiscoverCommand", "LMXPairCommand", "LMXNotifyCommand",
                "LMXCore", "LMXSystem",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),

        .testTarget(name: "LMXCoreTests", dependencies: ["LMXCore"]),
        // Fixtures/: a database made by an earlier version, opened as it is.
        .testTarget(name: "LMXStoreTests", dependencies: ["LMXCore", "LMXStore"], exclude: ["Fixtures"]),
        // The daemon's parts in process: the status API and the gateway's refusals through
        // HummingbirdTesting's router tests, the manager, probes against a local server, the
        // system layer.
        .testTarget(
            name: "LMXAgentTests",
            dependencies: [
                "LMXAgent", "LMXCore", "LMXProbe", "LMXStore", "LMXSystem", "LMXStatusClient", "LMXDiscovery",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The commands' own parsing, in process.
        .testTarget(
            name: "LMXCommandTests",
            dependencies: ["LMXStatusCommand", .product(name: "ArgumentParser", package: "swift-argument-parser")]
        ),
        .testTarget(name: "LMXDiscoveryTests", dependencies: ["LMXCore", "LMXDiscovery", "CAvahi"]),
        // Mutated-image fuzzing of the decoders (libpng, TurboJPEG, zbar) in process.
        .testTarget(
            name: "LMXImageTests",
            dependencies: ["LMXCore", "LMXImage", "LMXSystem"] + processLaunching
        ),
        // End to end: the real binaries against real avahi-daemons, namespace hosts and servers.
        .testTarget(
            name: "IntegrationTests",
            dependencies: ["LMXCore", "LMXStatusClient", "LMXSystem"] + processLaunching
        ),
    ],
    swiftLanguageModes: [.v6]
)
