//! The API's routes and JSON bodies: a method, a path and a body, as the parser hands them on.
#![no_main]
use api::http::Request;
use libfuzzer_sys::fuzz_target;

const METHODS: [&str; 4] = ["GET", "PUT", "PATCH", "DELETE"];
const PATHS: [&str; 16] = [
    "/",
    "/actions",
    "/boot-source",
    "/machine-config",
    "/drives/rootfs",
    "/network-interfaces/eth0",
    "/vsock",
    "/entropy",
    "/balloon",
    "/balloon/statistics",
    "/mmds",
    "/mmds/config",
    "/logger",
    "/metrics",
    "/snapshot/create",
    "/snapshot/load",
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let request = Request {
        method: METHODS[usize::from(selector & 3)].to_string(),
        path: PATHS[usize::from(selector >> 4)].to_string(),
        body: body.to_vec(),
        keep_alive: true,
    };
    let _ = api::routes::parse(&request);
});
