//! Firecracker's API file reduced to its key sets (`tests/data/firecracker-api-shapes.json`,
//! written by `scripts/api-shapes.py`), and a check of a GET answer against them: every key
//! is one the file defines, and every key the file defines is there (`null` or `[]` when
//! unset, as Firecracker answers) unless Firecracker itself leaves it out.

use serde_json::Value;

const SHAPES: &str = include_str!("../data/firecracker-api-shapes.json");

/// Keys Firecracker leaves out of its own answers, with why.
const OMITTED: &[(&str, &str, &str)] = &[
    (
        "MachineConfiguration",
        "cpu_template",
        "shown only while a static template is set",
    ),
    ("Vsock", "vsock_id", "deprecated, never shown"),
    ("CpuConfig", "reg_modifiers", "aarch64 only"),
    ("CpuConfig", "vcpu_features", "aarch64 only"),
];

pub struct Shapes(Value);

impl Shapes {
    pub fn load() -> Shapes {
        Shapes(serde_json::from_str(SHAPES).expect("the shapes file is JSON"))
    }

    /// The definition each GET path answers with.
    pub fn gets(&self) -> Vec<(String, String)> {
        self.0["gets"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(path, def)| (path.clone(), def.as_str().unwrap().to_string()))
            .collect()
    }

    /// What is wrong with `value` as definition `name`, one line each ("at.key: ...").
    pub fn check(&self, value: &Value, name: &str, at: &str) -> Vec<String> {
        let mut problems = Vec::new();
        self.walk(value, name, at, &mut problems);
        problems
    }

    fn walk(&self, value: &Value, name: &str, at: &str, problems: &mut Vec<String>) {
        let def = &self.0["definitions"][name];
        let properties = def["properties"].as_object().expect("a known definition");
        let Some(object) = value.as_object() else {
            problems.push(format!("{at}: not an object but {value}"));
            return;
        };
        for key in object.keys() {
            if !properties.contains_key(key) {
                problems.push(format!("{at}.{key}: not a key of {name} in the API file"));
            }
        }
        // BalloonStats' optional keys are what the guest's driver reported.
        let required: Vec<&str> = def["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap())
            .collect();
        for (key, target) in properties {
            let omitted = OMITTED.iter().any(|(d, k, _)| *d == name && k == key)
                || (name == "BalloonStats" && !required.contains(&key.as_str()));
            match object.get(key) {
                None if !omitted => problems.push(format!("{at}.{key}: missing")),
                Some(inner) => {
                    if let Some(target) = target.as_str() {
                        let items: Vec<&Value> = match inner {
                            Value::Array(items) => items.iter().collect(),
                            Value::Null => Vec::new(),
                            one => vec![one],
                        };
                        for (i, item) in items.iter().enumerate() {
                            let at = match inner {
                                Value::Array(_) => format!("{at}.{key}[{i}]"),
                                _ => format!("{at}.{key}"),
                            };
                            self.walk(item, target, &at, problems);
                        }
                    }
                }
                None => {}
            }
        }
    }
}
