//! Compiles the `.proto` subset in `proto/` to Rust with protox (a pure-Rust protobuf compiler:
//! no system `protoc` needed) and tonic's code generator.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let files = protox::compile(["envoy/service/ratelimit/v3/rls.proto"], ["proto"])?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(files)?;
    Ok(())
}
