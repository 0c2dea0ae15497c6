//! Firecracker's paths and methods, turned into [`VmmAction`]s. Request bodies go through
//! the configuration model's own parser ([`vmm::config::parse_json_in`]), so that the API and
//! a config file refuse the same mistake with the same sentence. Paths of features Ember does
//! not have yet are known, and answered with a message that names the feature.

use serde::Deserialize;
use vmm::config::{
    parse_json_in, valid_id, BootSourceConfig, ConfigError, CpuTemplate, DriveConfig,
    EntropyDeviceConfig, LoggerConfig, MachineConfig, MachineConfigUpdate, MetricsConfig,
    MmdsConfig, MmdsVersion, NetworkInterfaceConfig, PartialDrive, PartialNetworkInterface,
    SerialConfig,
};
use vmm::rpc::VmmAction;

use crate::http::{Request, Response};

/// What a request asks for: an action for the VMM thread, or an answer the router already
/// knows (an unknown path, a bad body).
#[derive(Debug)]
pub enum Routed {
    Action(VmmAction),
    Answer(Response),
}

/// Each path of Firecracker's API file, by what it does in Ember.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Root,
    Version,
    MachineConfig,
    BootSource,
    Drive,
    NetworkInterface,
    Mmds,
    MmdsConfig,
    Entropy,
    Vsock,
    CpuConfig,
    Serial,
    SnapshotCreate,
    SnapshotLoad,
    Balloon,
    BalloonStats,
    BalloonHinting(Hinting),
    Actions,
    Logger,
    Metrics,
    VmConfig,
    VmState,
    Unsupported(&'static str),
}

impl Route {
    /// The methods the API file defines for this path.
    fn methods(self, path: &[&str]) -> &'static [&'static str] {
        match (self, path) {
            (Route::Root | Route::Version | Route::VmConfig, _) => &["GET"],
            (Route::MachineConfig, _) => &["GET", "PUT", "PATCH"],
            (Route::BootSource | Route::Actions | Route::Logger | Route::Metrics, _) => &["PUT"],
            (Route::Drive | Route::NetworkInterface, _) => &["PUT", "PATCH"],
            (Route::Mmds, _) => &["GET", "PUT", "PATCH"],
            (
                Route::MmdsConfig
                | Route::Entropy
                | Route::Vsock
                | Route::CpuConfig
                | Route::Serial
                | Route::SnapshotCreate
                | Route::SnapshotLoad,
                _,
            ) => &["PUT"],
            (Route::VmState, _) => &["PATCH"],
            (Route::Balloon, _) | (_, ["hotplug", "memory"]) => &["GET", "PUT", "PATCH"],
            (Route::BalloonStats, _) => &["GET", "PATCH"],
            (Route::BalloonHinting(Hinting::Status), _) => &["GET"],
            (Route::BalloonHinting(_), _) => &["PATCH"],
            (_, ["pmem", _]) => &["PUT", "PATCH"],
            _ => &["PUT"],
        }
    }
}

/// Finds the route of a path split at '/', or None if the API file has no such path.
fn route(path: &[&str]) -> Option<Route> {
    use Route::*;
    Some(match path {
        [] => Root,
        ["version"] => Version,
        ["machine-config"] => MachineConfig,
        ["boot-source"] => BootSource,
        ["drives", _] => Drive,
        ["actions"] => Actions,
        ["vm", "config"] => VmConfig,
        ["vm"] => VmState,
        ["network-interfaces", _] => NetworkInterface,
        ["mmds"] => Mmds,
        ["mmds", "config"] => MmdsConfig,
        // Firecracker routes `/vsock/{id}` (its deprecated device ID) to `/vsock`.
        ["vsock"] | ["vsock", _] => Vsock,
        ["entropy"] => Entropy,
        ["balloon"] => Balloon,
        ["balloon", "statistics"] => BalloonStats,
        ["balloon", "hinting", "start"] => BalloonHinting(Hinting::Start),
        ["balloon", "hinting", "status"] => BalloonHinting(Hinting::Status),
        ["balloon", "hinting", "stop"] => BalloonHinting(Hinting::Stop),
        ["logger"] => Logger,
        ["metrics"] => Metrics,
        ["snapshot", "create"] => SnapshotCreate,
        ["snapshot", "load"] => SnapshotLoad,
        ["cpu-config"] => CpuConfig,
        ["pmem", _] => Unsupported("virtio-pmem devices (/pmem)"),
        ["hotplug", "memory"] => Unsupported("memory hotplug (/hotplug/memory)"),
        ["serial"] => Serial,
        _ => return None,
    })
}

/// `/balloon/hinting/{start,status,stop}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hinting {
    Start,
    Status,
    Stop,
}

/// `PUT /actions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    action_type: ActionType,
    /// BlockDeviceRescan's drive ID; ignored by the other actions.
    payload: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
enum ActionType {
    BlockDeviceRescan,
    FlushMetrics,
    InstanceStart,
    SendCtrlAltDel,
}

/// `PATCH /vm`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct VmStateBody {
    state: VmState,
}

#[derive(Debug, Deserialize)]
enum VmState {
    Paused,
    Resumed,
}

fn bad_request(message: &str) -> Response {
    Response::fault(400, message)
}

fn config_error(e: &ConfigError) -> Response {
    bad_request(&e.to_string())
}

/// Firecracker's message for a path or method it does not serve.
fn invalid_path(req: &Request) -> String {
    format!(
        "Invalid request method and/or path: {} {}.",
        req.method, req.path
    )
}

/// Parses the body of a request for `section`, or answers with why it cannot be parsed.
fn body<T: for<'a> Deserialize<'a>>(req: &Request, section: &str) -> Result<T, Response> {
    let text = std::str::from_utf8(&req.body)
        .map_err(|e| bad_request(&format!("the request body is not valid UTF-8: {e}")))?;
    parse_json_in(text, Some(section)).map_err(|e| config_error(&e))
}

/// The body of a request on `/{section}/{id}` (`segments`), which must name the same ID.
fn body_for_id<T: for<'a> Deserialize<'a> + Identified>(
    req: &Request,
    segments: &[&str],
) -> Result<T, Response> {
    let parsed: T = body(req, segments[0])?;
    path_id(segments[1], parsed.id(), T::INVALID)?;
    Ok(parsed)
}

/// A body whose ID the request's path repeats.
trait Identified {
    fn id(&self) -> &str;
    /// The error for an ID that is not valid.
    const INVALID: fn(String) -> ConfigError;
}

/// Each such body, the field holding its ID, and its error.
macro_rules! identified {
    ($($body:ty => $field:ident, $invalid:expr;)*) => {$(
        impl Identified for $body {
            fn id(&self) -> &str {
                &self.$field
            }
            const INVALID: fn(String) -> ConfigError = $invalid;
        }
    )*};
}

identified! {
    DriveConfig => drive_id, ConfigError::DriveId;
    PartialDrive => drive_id, ConfigError::DriveId;
    NetworkInterfaceConfig => iface_id, ConfigError::IfaceId;
    PartialNetworkInterface => iface_id, ConfigError::IfaceId;
}

/// Firecracker's checks of an ID in the path, and that the body names the same ID.
fn path_id(id: &str, in_body: &str, invalid: fn(String) -> ConfigError) -> Result<(), Response> {
    if id.is_empty() {
        return Err(bad_request("The ID cannot be empty."));
    }
    if !valid_id(id) {
        return Err(config_error(&invalid(id.to_string())));
    }
    if id != in_body {
        return Err(bad_request(
            "The id from the path does not match the id from the body!",
        ));
    }
    Ok(())
}

/// Turns one HTTP request into what it asks for.
pub fn parse(req: &Request) -> Routed {
    let segments: Vec<&str> = req.path.split('/').filter(|s| !s.is_empty()).collect();
    let Some(route) = route(&segments) else {
        return Routed::Answer(Response::fault(404, &invalid_path(req)));
    };
    let methods = route.methods(&segments);
    if !methods.contains(&req.method.as_str()) {
        return Routed::Answer(
            Response::fault(405, &invalid_path(req)).with_header("Allow", methods.join(", ")),
        );
    }
    // Firecracker's rules for bodies: none on GET, one on PUT and PATCH (but for the
    // balloon's hinting runs, whose body is optional).
    let optional = matches!(route, Route::BalloonHinting(_));
    match (req.method.as_str(), req.body.is_empty()) {
        ("GET", false) => return Routed::Answer(bad_request("GET request cannot have a body.")),
        ("PUT", true) => return Routed::Answer(bad_request("Empty PUT request.")),
        ("PATCH", true) if !optional => return Routed::Answer(bad_request("Empty PATCH request.")),
        _ => {}
    }
    match parse_route(req, route, &segments) {
        Ok(action) => Routed::Action(action),
        Err(answer) => Routed::Answer(answer),
    }
}

fn parse_route(req: &Request, route: Route, segments: &[&str]) -> Result<VmmAction, Response> {
    let method = req.method.as_str();
    Ok(match (route, method) {
        (Route::Root, _) => VmmAction::GetInstanceInfo,
        (Route::Version, _) => VmmAction::GetVersion,
        (Route::VmConfig, _) => VmmAction::GetFullConfig,
        (Route::MachineConfig, "GET") => VmmAction::GetMachineConfig,
        (Route::MachineConfig, "PUT") => {
            VmmAction::PutMachineConfig(body::<MachineConfig>(req, "machine-config")?)
        }
        (Route::MachineConfig, _) => {
            let update: MachineConfigUpdate = body(req, "machine-config")?;
            if update.is_empty() {
                return Err(bad_request("Empty PATCH request."));
            }
            VmmAction::PatchMachineConfig(update)
        }
        (Route::BootSource, _) => {
            VmmAction::PutBootSource(body::<BootSourceConfig>(req, "boot-source")?)
        }
        (Route::Drive, "PUT") => VmmAction::PutDrive(body_for_id(req, segments)?),
        (Route::Drive, _) => VmmAction::PatchDrive(body_for_id(req, segments)?),
        (Route::NetworkInterface, "PUT") => {
            VmmAction::PutNetworkInterface(body_for_id(req, segments)?)
        }
        (Route::NetworkInterface, _) => {
            VmmAction::PatchNetworkInterface(body_for_id(req, segments)?)
        }
        (Route::Mmds, "GET") => VmmAction::GetMmds,
        (Route::Mmds, "PUT") => VmmAction::PutMmds(body(req, "mmds")?),
        (Route::Mmds, _) => VmmAction::PatchMmds(body(req, "mmds")?),
        (Route::MmdsConfig, _) => VmmAction::PutMmdsConfig(body::<MmdsConfig>(req, "mmds-config")?),
        (Route::Entropy, _) => VmmAction::PutEntropy(body::<EntropyDeviceConfig>(req, "entropy")?),
        (Route::Vsock, _) => VmmAction::PutVsock(body(req, "vsock")?),
        (Route::Serial, _) => VmmAction::PutSerial(body::<SerialConfig>(req, "serial")?),
        (Route::CpuConfig, _) => VmmAction::PutCpuConfig(body::<CpuTemplate>(req, "cpu-config")?),
        (Route::SnapshotCreate, _) => VmmAction::CreateSnapshot(body(req, "snapshot")?),
        (Route::SnapshotLoad, _) => VmmAction::LoadSnapshot(body(req, "snapshot")?),
        (Route::Balloon, "GET") => VmmAction::GetBalloon,
        (Route::Balloon, "PUT") => VmmAction::PutBalloon(body(req, "balloon")?),
        (Route::Balloon, _) => VmmAction::PatchBalloon(body(req, "balloon")?),
        (Route::BalloonStats, "GET") => VmmAction::GetBalloonStats,
        (Route::BalloonStats, _) => VmmAction::PatchBalloonStats(body(req, "balloon")?),
        // The body is optional, as in Firecracker: none acknowledges the run's end.
        (Route::BalloonHinting(Hinting::Start), _) if req.body.is_empty() => {
            VmmAction::StartBalloonHinting(Default::default())
        }
        (Route::BalloonHinting(Hinting::Start), _) => {
            VmmAction::StartBalloonHinting(body(req, "balloon")?)
        }
        (Route::BalloonHinting(Hinting::Status), _) => VmmAction::GetBalloonHinting,
        (Route::BalloonHinting(Hinting::Stop), _) => VmmAction::StopBalloonHinting,
        (Route::Logger, _) => VmmAction::PutLogger(body::<LoggerConfig>(req, "logger")?),
        (Route::Metrics, _) => VmmAction::PutMetrics(body::<MetricsConfig>(req, "metrics")?),
        (Route::Actions, _) => {
            let ActionBody {
                action_type,
                payload,
            } = body(req, "actions")?;
            match (action_type, payload) {
                (ActionType::BlockDeviceRescan, Some(serde_json::Value::String(id))) => {
                    VmmAction::RescanDrive(id)
                }
                (ActionType::BlockDeviceRescan, _) => {
                    return Err(bad_request(
                        "BlockDeviceRescan needs the drive's ID as a string in `payload`.",
                    ))
                }
                (ActionType::InstanceStart, _) => VmmAction::InstanceStart,
                (ActionType::SendCtrlAltDel, _) => VmmAction::SendCtrlAltDel,
                (ActionType::FlushMetrics, _) => VmmAction::FlushMetrics,
            }
        }
        (Route::VmState, _) => match body::<VmStateBody>(req, "vm")?.state {
            VmState::Paused => VmmAction::Pause,
            VmState::Resumed => VmmAction::Resume,
        },
        (Route::Unsupported(what), _) => return Err(config_error(&ConfigError::Unsupported(what))),
    })
}

/// Firecracker's sentence for a request that uses a deprecated field; its answer carries a
/// `Deprecation: true` header.
pub fn deprecation(action: &VmmAction) -> Option<&'static str> {
    match action {
        VmmAction::PutVsock(c) if c.vsock_id.is_some() => {
            Some("PUT /vsock: vsock_id field is deprecated.")
        }
        VmmAction::PutMachineConfig(m) if m.cpu_template.is_some() => {
            Some("PUT /machine-config: cpu_template field is deprecated.")
        }
        VmmAction::PatchMachineConfig(m) if m.cpu_template.is_some() => {
            Some("PATCH /machine-config: cpu_template field is deprecated.")
        }
        VmmAction::PutMmdsConfig(c) if c.version == MmdsVersion::V1 => {
            Some("PUT /mmds/config: V1 is deprecated. Use V2 instead.")
        }
        VmmAction::LoadSnapshot(p) if p.mem_file_path.is_some() || p.enable_diff_snapshots => Some(
            "PUT /snapshot/load: mem_file_path and enable_diff_snapshots fields are deprecated.",
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, path: &str, body: &str) -> Request {
        Request {
            method: method.into(),
            path: path.into(),
            body: body.as_bytes().to_vec(),
            keep_alive: true,
        }
    }

    fn answer(r: Routed) -> Response {
        match r {
            Routed::Answer(resp) => resp,
            Routed::Action(a) => panic!("expected an answer, got {a:?}"),
        }
    }

    fn action(r: Routed) -> VmmAction {
        match r {
            Routed::Action(a) => a,
            Routed::Answer(resp) => panic!("expected an action, got {resp:?}"),
        }
    }

    #[test]
    fn paths_and_methods() {
        assert_eq!(
            action(parse(&req("GET", "/", ""))),
            VmmAction::GetInstanceInfo
        );
        assert_eq!(
            action(parse(&req("GET", "/vm/config", ""))),
            VmmAction::GetFullConfig
        );
        assert_eq!(
            action(parse(&req("PATCH", "/vm", r#"{"state":"Paused"}"#))),
            VmmAction::Pause
        );
        let r = answer(parse(&req("GET", "/nope", "")));
        assert_eq!(r.status, 404);
        assert!(r
            .body
            .unwrap()
            .contains("Invalid request method and/or path: GET /nope."));
        let r = answer(parse(&req("DELETE", "/machine-config", "")));
        assert_eq!(r.status, 405);
        assert_eq!(r.headers, vec![("Allow", "GET, PUT, PATCH".to_string())]);
        assert_eq!(answer(parse(&req("GET", "/drives/x/y", ""))).status, 404);
        assert_eq!(answer(parse(&req("GET", "/drives/x", ""))).status, 405);
    }

    #[test]
    fn firecracker_body_rules() {
        let r = answer(parse(&req("GET", "/", "{}")));
        assert!(r.body.unwrap().contains("GET request cannot have a body."));
        let r = answer(parse(&req("PUT", "/boot-source", "")));
        assert!(r.body.unwrap().contains("Empty PUT request."));
        let r = answer(parse(&req("PATCH", "/machine-config", "{}")));
        assert!(r.body.unwrap().contains("Empty PATCH request."));
        let r = answer(parse(&req(
            "PUT",
            "/drives/a",
            r#"{"drive_id":"b","path_on_host":"/x","is_root_device":false}"#,
        )));
        assert!(r.body.unwrap().contains("does not match"));
    }

    #[test]
    fn body_errors_name_the_field_like_a_config_file() {
        let r = answer(parse(&req(
            "PUT",
            "/machine-config",
            r#"{"vcpu_count":"2","mem_size_mib":128}"#,
        )));
        assert_eq!(r.status, 400);
        let body = r.body.unwrap();
        assert!(
            body.contains("machine-config.vcpu_count: invalid type"),
            "{body}"
        );
        let r = answer(parse(&req("PUT", "/vsock", r#"{"guest_cid":3}"#)));
        assert!(r.body.unwrap().contains("missing field `uds_path`"));
    }
}
