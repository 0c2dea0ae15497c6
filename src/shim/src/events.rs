//! The task events containerd learns of a shim's processes from (`/tasks/...`).

use std::sync::Mutex;
use std::time::SystemTime;

use containerd_shim::protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskStart,
};
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim::protos::protobuf::{MessageDyn, MessageField};
use containerd_shim::protos::topics;
use containerd_shim::protos::ttrpc::context::Context;
use containerd_shim::publisher::RemotePublisher;

pub fn timestamp(at: SystemTime) -> Timestamp {
    let since = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        seconds: since.as_secs() as i64,
        nanos: since.subsec_nanos() as i32,
        ..Default::default()
    }
}

pub struct Events {
    namespace: String,
    publisher: Mutex<RemotePublisher>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Events {
    pub fn new(namespace: &str, publisher: RemotePublisher) -> Events {
        Events {
            namespace: namespace.to_string(),
            publisher: Mutex::new(publisher),
        }
    }

    fn publish(&self, topic: &str, event: Box<dyn MessageDyn>) {
        let publisher = self.publisher.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = publisher.publish(Context::default(), topic, &self.namespace, event) {
            log::warn!("cannot publish {topic}: {e}");
        }
    }

    pub fn created(&self, id: &str, bundle: &str, pid: u32) {
        let event = TaskCreate {
            container_id: id.to_string(),
            bundle: bundle.to_string(),
            pid,
            ..Default::default()
        };
        self.publish(topics::TASK_CREATE_EVENT_TOPIC, Box::new(event));
    }

    pub fn started(&self, id: &str, exec_id: Option<&str>, pid: u32) {
        match exec_id {
            None => {
                let event = TaskStart {
                    container_id: id.to_string(),
                    pid,
                    ..Default::default()
                };
                self.publish(topics::TASK_START_EVENT_TOPIC, Box::new(event));
            }
            Some(exec_id) => {
                let event = TaskExecStarted {
                    container_id: id.to_string(),
                    exec_id: exec_id.to_string(),
                    pid,
                    ..Default::default()
                };
                self.publish(topics::TASK_EXEC_STARTED_EVENT_TOPIC, Box::new(event));
            }
        }
    }

    pub fn exec_added(&self, id: &str, exec_id: &str) {
        let event = TaskExecAdded {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            ..Default::default()
        };
        self.publish(topics::TASK_EXEC_ADDED_EVENT_TOPIC, Box::new(event));
    }

    /// `exec_id` is the container's ID for its init, as containerd expects.
    pub fn exited(&self, id: &str, exec_id: &str, pid: u32, status: u32, at: SystemTime) {
        let event = TaskExit {
            container_id: id.to_string(),
            id: exec_id.to_string(),
            pid,
            exit_status: status,
            exited_at: MessageField::some(timestamp(at)),
            ..Default::default()
        };
        self.publish(topics::TASK_EXIT_EVENT_TOPIC, Box::new(event));
    }

    pub fn deleted(&self, id: &str, pid: u32, status: u32, at: SystemTime) {
        let event = TaskDelete {
            container_id: id.to_string(),
            pid,
            exit_status: status,
            exited_at: MessageField::some(timestamp(at)),
            ..Default::default()
        };
        self.publish(topics::TASK_DELETE_EVENT_TOPIC, Box::new(event));
    }
}
