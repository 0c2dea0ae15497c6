//! Kubernetes runs pods on Ember: containerd's CRI plugin driven over its gRPC socket as
//! kubelet drives it, with the runtime handler `ember` (a RuntimeClass's handler). The
//! pod's sandbox is one microVM; its containers share it.

mod common;

use std::time::{Duration, Instant};

use common::containerd::*;
use common::cri::*;
use common::linux::*;
use common::netns::NetNs;
use common::*;
use k8s_cri::v1::ContainerState;

/// kubelet's sequence for a pod of two containers sharing a PID namespace: run the pod,
/// check the image is there (kubelet's IfNotPresent), create and start both, read their
/// CRI logs, ExecSync, stats, stop and remove each, stop and remove the pod; then nothing
/// of it is left.
#[test]
fn linux_cri_runs_a_pod_of_two_containers_on_ember() {
    let Some(img) = linux_or_skip("linux_cri_runs_a_pod_of_two_containers_on_ember") else {
        return;
    };
    if !containerd_or_skip("linux_cri_runs_a_pod_of_two_containers_on_ember") {
        return;
    }
    let Some(netns) = NetNs::new_or_skip("linux_cri_runs_a_pod_of_two_containers_on_ember") else {
        return;
    };
    let s = Scratch::new("cri");
    let c = Containerd::start_cri(&s, &img, true, &netns);
    let cri = Cri::connect(&c.sock);
    let version = cri.version().unwrap();
    assert_eq!(version.runtime_name, "containerd");
    assert!(cri.image_present(IMAGE), "{IMAGE} was imported");

    let logs = s.path("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let pod_config = pod_config("web", &logs, true);
    let started = Instant::now();
    let pod = cri
        .run_pod(&pod_config, "ember")
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", c.log()));
    eprintln!("RunPodSandbox took {:?}", started.elapsed());
    assert_eq!(pod.len(), 64, "CRI's IDs are 64 hex digits: {pod}");
    assert_eq!(c.embers().len(), 1, "one VM for the pod");

    let first = container_config(
        "first",
        IMAGE,
        &[
            "sh",
            "-c",
            "echo one; echo marker-$$ > /dev/shm/first; exec sleep 1000",
        ],
    );
    let first = cri.create(&pod, first, &pod_config).unwrap();
    cri.start(&first).unwrap();
    let second = container_config(
        "second",
        IMAGE,
        &["sh", "-c", "echo two >&2; exec sleep 1001"],
    );
    let second = cri.create(&pod, second, &pod_config).unwrap();
    cri.start(&second).unwrap();
    assert_eq!(c.embers().len(), 1, "the pod's containers share its VM");

    // Logs in CRI's format, in the pod's log directory.
    let start = Instant::now();
    while log_lines(&logs.join("first.log")).is_empty()
        || log_lines(&logs.join("second.log")).is_empty()
    {
        assert!(
            start.elapsed() < linux_deadline(),
            "no logs in {}",
            logs.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        log_lines(&logs.join("first.log")),
        [("stdout".to_string(), "one".to_string())]
    );
    assert_eq!(
        log_lines(&logs.join("second.log")),
        [("stderr".to_string(), "two".to_string())]
    );

    // ExecSync in the second container sees the first's process (one PID namespace) and
    // its file in the pod's /dev/shm.
    let (code, out, err) = cri
        .exec_sync(
            &second,
            &["sh", "-c", "ps -o args; cat /dev/shm/first; exit 3"],
            60,
        )
        .unwrap();
    assert_eq!(code, 3, "{out} {err}");
    assert!(
        out.contains("sleep 1000") && out.contains("sleep 1001"),
        "{out}"
    );
    assert!(out.contains("marker-"), "{out}");

    // Stats come from the container's cgroup in the guest.
    let stats = cri.container_stats(&first).unwrap();
    let memory = stats
        .memory
        .and_then(|m| m.working_set_bytes)
        .map(|v| v.value);
    assert!(memory.unwrap_or(0) > 0, "{memory:?}");

    for id in [&first, &second] {
        let started = Instant::now();
        cri.stop(id, 10).unwrap();
        eprintln!("StopContainer took {:?}", started.elapsed());
        let status = cri.container_status(id).unwrap();
        assert_eq!(status.state, ContainerState::ContainerExited as i32);
        cri.remove(id).unwrap();
    }
    let started = Instant::now();
    cri.stop_pod(&pod).unwrap();
    cri.remove_pod(&pod).unwrap();
    eprintln!(
        "StopPodSandbox and RemovePodSandbox took {:?}",
        started.elapsed()
    );
    c.assert_nothing_left();
    let socket = shim_socket(&c.sock, "k8s.io", &pod);
    let start = Instant::now();
    while socket.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the pod's shim left its socket {}",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
