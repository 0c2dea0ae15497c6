//! A containerd of the test's own (Debian's 1.6: its own root, state, socket and config)
//! whose `io.containerd.ember.v2` runtime is the shim built beside `ember`, and a busybox
//! OCI image made from the host's busybox and imported without a registry.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::linux::Images;
use super::netns::NetNs;
use super::{skip, Scratch, EMBER};

pub const RUNTIME: &str = "io.containerd.ember.v2";
pub const IMAGE: &str = "docker.io/library/ember-test/busybox:1";
/// The pod sandbox's image under CRI: busybox sleeping (a pause process of its own).
pub const PAUSE: &str = "docker.io/library/ember-test/pause:1";

/// The shim, built beside `ember` (`cargo build` or `cargo test --workspace`).
pub fn shim_binary() -> PathBuf {
    Path::new(EMBER).with_file_name("containerd-shim-ember-v2")
}

#[derive(Debug)]
pub struct Containerd {
    pub dir: PathBuf,
    pub sock: PathBuf,
    /// The shim's state: one directory per sandbox.
    pub sandboxes: PathBuf,
    child: Child,
}

/// containerd, ctr and the shim, or None after printing why the test cannot run.
pub fn containerd_or_skip(test: &str) -> bool {
    for tool in ["containerd", "ctr", "mkfs.ext4", "tar", "sha256sum"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            skip(
                test,
                &format!("{tool} is not installed (.ci/install-deps installs it)"),
            );
            return false;
        }
    }
    assert!(
        shim_binary().exists(),
        "{} is not built (cargo build -p containerd-shim-ember)",
        shim_binary().display()
    );
    true
}

impl Containerd {
    /// Starts containerd in `s` with the shim configured for the project's guest (`mem_mib`
    /// by default; with `template`, sandboxes start from a snapshot of a booted guest) and
    /// imports the busybox image.
    pub fn start(s: &Scratch, img: &Images, mem_mib: u32, template: bool) -> Containerd {
        Self::start_with(s, img, mem_mib, template, None)
    }

    /// As [`Containerd::start`], with containerd's CRI plugin on (runtime handlers `runc`
    /// and `ember`, the pause image [`PAUSE`], CNI's bridge, host-local and portmap
    /// plugins) and containerd itself in the network namespace `cri_netns`, where CNI's
    /// bridge then lives; the images go to CRI's namespace, `k8s.io`.
    pub fn start_cri(s: &Scratch, img: &Images, template: bool, cri_netns: &NetNs) -> Containerd {
        Self::start_with(s, img, 256, template, Some(cri_netns))
    }

    fn start_with(
        s: &Scratch,
        img: &Images,
        mem_mib: u32,
        template: bool,
        cri_netns: Option<&NetNs>,
    ) -> Containerd {
        let dir = s.path("c");
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("containerd.sock");
        let mut config = format!(
            "version = 2\nroot = \"{0}/root\"\nstate = \"{0}/state\"\n[grpc]\n  address = \"{1}\"\n",
            dir.display(),
            sock.display()
        );
        match cri_netns {
            None => config.insert_str(0, "disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n"),
            Some(_) => {
                let cni = dir.join("cni");
                std::fs::create_dir_all(&cni).unwrap();
                let conf = json!({"cniVersion": "0.4.0", "name": "embercri", "plugins": [
                    {"type": "bridge", "bridge": "ember-cri0", "isGateway": true, "ipMasq": false,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.77.0.0/24"}]],
                              "dataDir": dir.join("ipam")}},
                    {"type": "portmap", "capabilities": {"portMappings": true}},
                    {"type": "loopback"}]});
                std::fs::write(cni.join("10-ember.conflist"), conf.to_string()).unwrap();
                config += &format!(
                    "[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{PAUSE}\"\n\
                     [plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/usr/lib/cni\"\n  conf_dir = \"{}\"\n\
                     [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\
                     [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.ember]\n  runtime_type = \"{RUNTIME}\"\n",
                    cni.display()
                );
            }
        }
        std::fs::write(dir.join("config.toml"), config).unwrap();
        let sandboxes = dir.join("sb");
        let shim = json!({"kernel": img.file("vmlinux"), "rootfs": img.file("rootfs.ext4"),
            "mem_size_mib": mem_mib, "state_dir": sandboxes, "cache_dir": dir.join("cache"),
            "start_from_template": template});
        std::fs::write(dir.join("shim.json"), shim.to_string()).unwrap();
        let bin = shim_binary().parent().unwrap().to_path_buf();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        // nsenter, not `ip netns exec`: that also remounts /sys, hiding the host's cgroups
        // from runc.
        let mut containerd = match cri_netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/var/run/netns/{}", ns.name))
                    .arg("containerd");
                c
            }
            None => Command::new("containerd"),
        };
        let child = containerd
            .arg("--config")
            .arg(dir.join("config.toml"))
            .env("PATH", path)
            .env("EMBER_SHIM_CONFIG", dir.join("shim.json"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start containerd");
        let c = Containerd {
            dir,
            sock,
            sandboxes,
            child,
        };
        let start = Instant::now();
        while !c.ctr(&["version"]).status.success() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "containerd did not start: {}",
                c.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut images = vec![busybox_image(s)];
        let mut import = vec!["image", "import"];
        if cri_netns.is_some() {
            images.push(oci_image(s, PAUSE, &["sleep", "2147483647"]));
            import.splice(0..0, ["--namespace", "k8s.io"]);
        }
        for image in images {
            let mut args = import.clone();
            args.push(image.to_str().unwrap());
            let out = c.ctr(&args);
            assert!(
                out.status.success(),
                "ctr image import: {}",
                text(&out.stderr)
            );
        }
        c
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// Sandboxes started from now on boot cold, or start from the template (the shim reads
    /// its configuration at each sandbox's start).
    pub fn use_template(&self, template: bool) {
        let file = self.dir.join("shim.json");
        let mut shim: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        shim["start_from_template"] = json!(template);
        std::fs::write(file, shim.to_string()).unwrap();
    }

    /// `ctr` against this containerd.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("ctr");
        command.arg("--address").arg(&self.sock).args(args);
        command
    }

    pub fn ctr(&self, args: &[&str]) -> Output {
        self.command(args)
            .stdin(Stdio::null())
            .output()
            .expect("run ctr")
    }

    /// `ctr run --rm` of the busybox image in the Ember runtime: its output.
    pub fn run(&self, id: &str, options: &[&str], args: &[&str]) -> Output {
        let mut all = vec!["run", "--rm", "--runtime", RUNTIME];
        all.extend_from_slice(options);
        all.extend_from_slice(&[IMAGE, id]);
        all.extend_from_slice(args);
        self.ctr(&all)
    }

    /// `ctr run -d --null-io` with `options`: the container runs on, detached.
    pub fn run_detached(&self, id: &str, options: &[&str], args: &[&str]) {
        let mut all = vec!["run", "-d", "--null-io", "--runtime", RUNTIME];
        all.extend_from_slice(options);
        all.extend_from_slice(&[IMAGE, id]);
        all.extend_from_slice(args);
        let out = self.ctr(&all);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }

    /// SIGKILL to container `id`'s task; once a task shows STOPPED, the task and the
    /// container are deleted.
    pub fn kill_and_delete(&self, id: &str) {
        let out = self.ctr(&["task", "kill", "-s", "KILL", id]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let start = Instant::now();
        while !text(&self.ctr(&["task", "ls"]).stdout).contains("STOPPED") {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{id} never stopped"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        for what in ["task", "container"] {
            let out = self.ctr(&[what, "delete", id]);
            assert!(out.status.success(), "{}", text(&out.stderr));
        }
    }

    /// `ctr run --rm` started, not waited for: the process and its output's lines.
    pub fn spawn_run(
        &self,
        id: &str,
        args: &[&str],
    ) -> (
        Child,
        std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    ) {
        use std::io::BufRead;
        let mut all = vec!["run", "--rm", "--runtime", RUNTIME, IMAGE, id];
        all.extend_from_slice(args);
        let mut child = self
            .command(&all)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run ctr");
        let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        (child, lines)
    }

    /// The ember processes of this containerd's sandboxes (their command lines name the
    /// sandbox directory).
    pub fn embers(&self) -> Vec<(u32, String)> {
        let marker = self.sandboxes.to_string_lossy().into_owned();
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(&marker) && !cmdline.contains("containerd-shim") {
                found.push((pid, cmdline));
            }
        }
        found
    }

    /// Nothing of a finished sandbox is left: no ember process, no sandbox directory or
    /// socket, no mount under the test's directories.
    pub fn assert_nothing_left(&self) {
        let start = Instant::now();
        loop {
            let embers = self.embers();
            let dirs: Vec<_> = std::fs::read_dir(&self.sandboxes)
                .map(|d| d.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
            let mounts: Vec<String> = std::fs::read_to_string("/proc/mounts")
                .unwrap()
                .lines()
                .filter(|l| {
                    l.contains(self.sandboxes.to_str().unwrap()) || l.contains("cache/layers")
                })
                .map(str::to_string)
                .collect();
            if embers.is_empty() && dirs.is_empty() && mounts.is_empty() {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "left behind: embers {embers:?}, sandbox directories {dirs:?}, mounts {mounts:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Whatever a failed test left running goes with it.
        for (pid, _) in self.embers() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let root = self.dir.join("root");
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        for line in mounts.lines().rev() {
            if let Some(at) = line
                .split(' ')
                .nth(1)
                .filter(|at| at.starts_with(self.dir.to_str().unwrap()))
            {
                let _ = Command::new("umount").args(["-l", at]).status();
            }
        }
        let _ = root;
    }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The socket containerd 1.6 gives the shim of task `id` in `namespace`: under
/// /run/containerd/s, named by the SHA-256 of containerd's address, the namespace and the ID.
pub fn shim_socket(containerd_sock: &Path, namespace: &str, id: &str) -> PathBuf {
    let name = format!("{}/{namespace}/{id}", containerd_sock.display());
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(name.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let digest = text(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    Path::new("/run/containerd/s").join(digest)
}

fn sha256(file: &Path) -> String {
    let out = Command::new("sha256sum").arg(file).output().unwrap();
    text(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// An OCI image layout (one uncompressed layer: busybox and its applets), as a tar that
/// `ctr image import` takes.
fn busybox_image(s: &Scratch) -> PathBuf {
    oci_image(s, IMAGE, &["sh"])
}

/// An OCI image archive of the host's busybox, named `reference`, whose command is `cmd`.
fn oci_image(s: &Scratch, reference: &str, cmd: &[&str]) -> PathBuf {
    let name = reference.replace(['/', ':', '.'], "-");
    let tree = s.path(&format!("{name}-tree"));
    for dir in ["bin", "proc", "dev", "sys", "tmp", "etc", "root", "run"] {
        std::fs::create_dir_all(tree.join(dir)).unwrap();
    }
    std::fs::copy("/bin/busybox", tree.join("bin/busybox")).unwrap();
    let applets = [
        "sh", "echo", "sleep", "cat", "true", "hostname", "stty", "ps", "ls", "tty", "grep",
        "head", "id", "ip", "ping", "mount", "mkdir",
    ];
    for applet in applets {
        std::os::unix::fs::symlink("busybox", tree.join("bin").join(applet)).unwrap();
    }
    let layout = s.path(&format!("{name}-layout"));
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let layer = s.path(&format!("{name}-layer.tar"));
    let ok = Command::new("tar")
        .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
        .arg(&tree)
        .arg("-cf")
        .arg(&layer)
        .arg(".")
        .status()
        .unwrap()
        .success();
    assert!(ok, "tar of the image layer");
    let blob = |path: &Path| -> (String, u64) {
        let digest = sha256(path);
        std::fs::copy(path, blobs.join(&digest)).unwrap();
        (
            format!("sha256:{digest}"),
            std::fs::metadata(path).unwrap().len(),
        )
    };
    let (layer_digest, layer_size) = blob(&layer);
    let config = json!({"architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": cmd},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]}});
    let config_file = s.file(
        &format!("{name}-config.json"),
        config.to_string().as_bytes(),
    );
    let (config_digest, config_size) = blob(Path::new(&config_file));
    let manifest = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer_size}]});
    let manifest_file = s.file(
        &format!("{name}-manifest.json"),
        manifest.to_string().as_bytes(),
    );
    let (manifest_digest, manifest_size) = blob(Path::new(&manifest_file));
    let index = json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest, "size": manifest_size,
        "annotations": {"io.containerd.image.name": reference, "org.opencontainers.image.ref.name": "1"}}]});
    std::fs::write(layout.join("index.json"), index.to_string()).unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let image = s.path(&format!("{name}-oci.tar"));
    let ok = Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&image)
        .args(["oci-layout", "index.json", "blobs"])
        .status()
        .unwrap()
        .success();
    assert!(ok, "tar of the image layout");
    image
}
