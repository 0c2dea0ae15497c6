//! The VMM thread's answers as HTTP responses: 204 with no body for a change, 200 with JSON
//! for data, 400 with `{"fault_message": ...}` for a refusal, as Firecracker answers.

use vmm::rpc::{ActionError, ActionResult, VmmData};

use crate::http::Response;

pub fn to_response(result: &ActionResult) -> Response {
    let json = |value: serde_json::Result<String>| match value {
        Ok(text) => Response::json(200, text),
        Err(e) => Response::fault(500, &format!("cannot encode the answer: {e}")),
    };
    match result {
        Ok(VmmData::Empty) => Response::no_content(),
        Ok(VmmData::InstanceInfo(info)) => json(serde_json::to_string(info)),
        Ok(VmmData::Version(v)) => json(Ok(
            serde_json::json!({ "firecracker_version": v }).to_string()
        )),
        Ok(VmmData::MachineConfig(m)) => json(serde_json::to_string(m)),
        Ok(VmmData::FullConfig(c)) => json(serde_json::to_string(c)),
        Ok(VmmData::Mmds(v)) => json(serde_json::to_string(v)),
        Ok(VmmData::Balloon(b)) => json(serde_json::to_string(b)),
        Ok(VmmData::BalloonStats(s)) => json(serde_json::to_string(s)),
        Ok(VmmData::HintingStatus(s)) => json(serde_json::to_string(s)),
        // Firecracker's status for a data store that would grow past its limit.
        Err(e @ ActionError::Mmds(mmds::StoreError::TooLarge { .. })) => {
            Response::fault(413, &e.to_string())
        }
        Err(e) => Response::fault(400, &e.to_string()),
    }
}
