//! A CRI client as kubelet is one: gRPC over containerd's socket (the `k8s-cri` crate's
//! generated `runtime.v1` clients), each call made synchronously on a small tokio runtime
//! of its own.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::*;
use tonic::transport::{Channel, Endpoint, Uri};

pub struct Cri {
    runtime: tokio::runtime::Runtime,
    service: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

/// A call's deadline: kubelet's default runtime request timeout is 2 minutes, and a
/// sandbox's first boot on an emulated host takes about that.
const DEADLINE: Duration = Duration::from_secs(240);

impl Cri {
    pub fn connect(sock: &Path) -> Cri {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let sock: PathBuf = sock.to_path_buf();
        let channel = runtime
            .block_on(
                Endpoint::from_static("http://[::]")
                    .timeout(DEADLINE)
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let sock = sock.clone();
                        async move {
                            let stream = tokio::net::UnixStream::connect(sock).await?;
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                        }
                    })),
            )
            .expect("connect to containerd's CRI socket");
        Cri {
            runtime,
            service: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        }
    }

    /// Runs one call; Err carries the gRPC status's message.
    fn call<T>(
        &self,
        f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, String> {
        self.runtime
            .block_on(f)
            .map(tonic::Response::into_inner)
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
    }

    pub fn version(&self) -> Result<VersionResponse, String> {
        let mut c = self.service.clone();
        self.call(c.version(VersionRequest::default()))
    }

    pub fn image_present(&self, image: &str) -> bool {
        let mut c = self.images.clone();
        let request = ImageStatusRequest {
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            verbose: false,
        };
        self.call(c.image_status(request))
            .is_ok_and(|r| r.image.is_some())
    }

    pub fn run_pod(&self, config: &PodSandboxConfig, handler: &str) -> Result<String, String> {
        let mut c = self.service.clone();
        let request = RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.into(),
        };
        self.call(c.run_pod_sandbox(request))
            .map(|r| r.pod_sandbox_id)
    }

    pub fn create(
        &self,
        pod: &str,
        config: ContainerConfig,
        sandbox: &PodSandboxConfig,
    ) -> Result<String, String> {
        let mut c = self.service.clone();
        let request = CreateContainerRequest {
            pod_sandbox_id: pod.into(),
            config: Some(config),
            sandbox_config: Some(sandbox.clone()),
        };
        self.call(c.create_container(request))
            .map(|r| r.container_id)
    }

    pub fn start(&self, id: &str) -> Result<(), String> {
        let mut c = self.service.clone();
        let request = StartContainerRequest {
            container_id: id.into(),
        };
        self.call(c.start_container(request)).map(drop)
    }

    /// ExecSync: (exit code, stdout, stderr).
    pub fn exec_sync(
        &self,
        id: &str,
        cmd: &[&str],
        timeout_secs: i64,
    ) -> Result<(i32, String, String), String> {
        let mut c = self.service.clone();
        let request = ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: timeout_secs,
        };
        self.call(c.exec_sync(request)).map(|r| {
            (
                r.exit_code,
                String::from_utf8_lossy(&r.stdout).into_owned(),
                String::from_utf8_lossy(&r.stderr).into_owned(),
            )
        })
    }

    pub fn container_stats(&self, id: &str) -> Result<ContainerStats, String> {
        let mut c = self.service.clone();
        let request = ContainerStatsRequest {
            container_id: id.into(),
        };
        self.call(c.container_stats(request))
            .and_then(|r| r.stats.ok_or_else(|| "no stats".into()))
    }

    pub fn container_status(&self, id: &str) -> Result<ContainerStatus, String> {
        let mut c = self.service.clone();
        let request = ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        self.call(c.container_status(request))
            .and_then(|r| r.status.ok_or_else(|| "no status".into()))
    }

    pub fn stop(&self, id: &str, timeout_secs: i64) -> Result<(), String> {
        let mut c = self.service.clone();
        let request = StopContainerRequest {
            container_id: id.into(),
            timeout: timeout_secs,
        };
        self.call(c.stop_container(request)).map(drop)
    }

    pub fn remove(&self, id: &str) -> Result<(), String> {
        let mut c = self.service.clone();
        let request = RemoveContainerRequest {
            container_id: id.into(),
        };
        self.call(c.remove_container(request)).map(drop)
    }

    pub fn stop_pod(&self, id: &str) -> Result<(), String> {
        let mut c = self.service.clone();
        let request = StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call(c.stop_pod_sandbox(request)).map(drop)
    }

    pub fn remove_pod(&self, id: &str) -> Result<(), String> {
        let mut c = self.service.clone();
        let request = RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call(c.remove_pod_sandbox(request)).map(drop)
    }
}

/// A pod's configuration as kubelet writes it: metadata, a log directory, and (with
/// `shared_pid`) one PID namespace for all its containers.
pub fn pod_config(name: &str, logs: &Path, shared_pid: bool) -> PodSandboxConfig {
    let pid = match shared_pid {
        true => NamespaceMode::Pod,
        false => NamespaceMode::Container,
    };
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: logs.to_string_lossy().into_owned(),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    pid: pid as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A container of `image` running `command`, logging to `NAME.log` in the pod's directory.
pub fn container_config(name: &str, image: &str, command: &[&str]) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        command: command.iter().map(|s| s.to_string()).collect(),
        log_path: format!("{name}.log"),
        linux: Some(LinuxContainerConfig::default()),
        ..Default::default()
    }
}

/// The lines a container wrote, from its CRI log file (`TIMESTAMP STREAM TAG TEXT` each).
pub fn log_lines(file: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(4, ' ');
            let _time = parts.next()?;
            let stream = parts.next()?;
            let _tag = parts.next()?;
            Some((stream.to_string(), parts.next().unwrap_or("").to_string()))
        })
        .collect()
}
