// swift-tools-version:6.0
// Not part of lmx-agent: the ceiling and the floor the gateway's data path is measured against (ceiling.py).
import PackageDescription

let package = Package(
    name: "lmx-relay-ceiling",
    dependencies: [.package(url: "https://github.com/apple/swift-nio", from: "2.80.0")],
    targets: [
        .executableTarget(
            name: "lmx-relay-ceiling",
            dependencies: [
                .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio"),
            ]),
        .executableTarget(
            name: "lmx-codec-ceiling",
            dependencies: [
                .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio"),
            ]),
        .executableTarget(
            name: "lmx-http-floor",
            dependencies: [
                .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio"),
            ]),
    ]
)
