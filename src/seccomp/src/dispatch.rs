//! Compiles seccompiler's JSON filters into programs that find a system call's rules by a
//! binary search over its number, instead of seccompiler's one comparison per system call in
//! turn.
//!
//! Why: when a filter is installed, the kernel runs it for every system call number to find
//! those it always allows (its action cache), with the filter's lock held. A chain of 60
//! comparisons makes that about 28,000 steps, 0.1-0.2 ms of every ember start per filter on
//! a nested host; a search makes it 3,000. Every system call a thread makes later also takes
//! 6 comparisons instead of up to 60.
//!
//! seccompiler still compiles every rule: each system call's rules become a program of their
//! own, whose body (after the architecture check and the load of the number) is a leaf of the
//! search. This file is also built into build.rs, so it depends on nothing but seccompiler
//! and serde_json.

use std::collections::BTreeMap;

use seccompiler::{sock_filter, BpfProgram};

const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const JA: u16 = 0x05;
/// seccomp_data's offsets: the system call's number, and the architecture.
const NR: u32 = 0;
const ARCH: u32 = 4;
/// The kernel refuses longer programs (BPF_MAXINSNS).
const MAX_INSTRUCTIONS: usize = 4096;
/// The instructions before the first system call's test: load the architecture, compare it,
/// kill on a mismatch, load the number.
const PROLOGUE: usize = 4;

/// One program per thread name in `json` (seccompiler's format), each searching for the
/// system call's rules. Errors are seccompiler's, or say which assumption about its output
/// failed.
pub fn compile(json: &[u8]) -> Result<BTreeMap<String, BpfProgram>, String> {
    // seccompiler checks the whole text first, so that its errors are the ones users see.
    let whole = seccompiler::compile_from_json(json, seccompiler::TargetArch::x86_64)
        .map_err(|e| e.to_string())?;
    let value: serde_json::Value = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    let threads = value
        .as_object()
        .ok_or("the filter file is not a JSON object")?;
    let mut programs = BTreeMap::new();
    for (name, linear) in whole {
        let filter = &threads[&name];
        let rules = filter["filter"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let program = match rules.is_empty() {
            true => linear,
            false => searched(&name, filter, rules)?,
        };
        programs.insert(name, program);
    }
    Ok(programs)
}

/// The thread's program with its rules grouped by system call, each group compiled alone.
fn searched(
    name: &str,
    filter: &serde_json::Value,
    rules: &[serde_json::Value],
) -> Result<BpfProgram, String> {
    let mut groups: BTreeMap<&str, Vec<serde_json::Value>> = BTreeMap::new();
    for rule in rules {
        let syscall = rule["syscall"]
            .as_str()
            .ok_or("a rule has no system call")?;
        groups.entry(syscall).or_default().push(rule.clone());
    }
    let mut prologue = None;
    let mut leaves = Vec::with_capacity(groups.len());
    for (syscall, rules) in groups {
        let mut alone = filter.clone();
        alone["filter"] = serde_json::Value::Array(rules);
        let text = serde_json::json!({ name: alone }).to_string();
        let mut compiled =
            seccompiler::compile_from_json(text.as_bytes(), seccompiler::TargetArch::x86_64)
                .map_err(|e| e.to_string())?;
        let program = compiled.remove(name).ok_or("seccompiler lost the thread")?;
        let (head, body) = split(&program)
            .ok_or_else(|| format!("seccompiler's program for {syscall} has an unknown shape"))?;
        prologue.get_or_insert_with(|| head.to_vec());
        leaves.push((body[0].k, body.to_vec()));
    }
    leaves.sort_by_key(|(nr, _)| *nr);
    let mut program = prologue.unwrap_or_default();
    program.extend(search(&leaves));
    if program.len() > MAX_INSTRUCTIONS {
        return Err(format!(
            "the {name} filter takes {} instructions; the kernel takes at most {MAX_INSTRUCTIONS}",
            program.len()
        ));
    }
    Ok(program)
}

/// seccompiler's program for one system call: its prologue, and the rest, which starts by
/// comparing the number with that system call's.
fn split(program: &[sock_filter]) -> Option<(&[sock_filter], &[sock_filter])> {
    let (head, body) = program.split_at_checked(PROLOGUE)?;
    let loads = |insn: &sock_filter, offset| insn.code == LD_W_ABS && insn.k == offset;
    let shaped = loads(&head[0], ARCH) && loads(&head[3], NR) && body.first()?.code == JEQ_K;
    shaped.then_some((head, body))
}

/// A binary search over `leaves` (sorted by number): each inner node sends numbers at or
/// above its middle leaf's to the right half; a leaf's own test sends any other number to the
/// filter's default action.
fn search(leaves: &[(u32, Vec<sock_filter>)]) -> Vec<sock_filter> {
    if let [(_, only)] = leaves {
        return only.clone();
    }
    let mid = leaves.len() / 2;
    let left = search(&leaves[..mid]);
    let right = search(&leaves[mid..]);
    let insn = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    // Jump offsets of a comparison are 8 bits; an unconditional jump's are 32.
    let mut out = Vec::with_capacity(2 + left.len() + right.len());
    out.push(insn(JGE_K, 0, 1, leaves[mid].0));
    out.push(insn(JA, 0, 0, left.len() as u32));
    out.extend(left);
    out.extend(right);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a classic BPF program on seccomp_data built from `nr`, `arch` and `args`, as
    /// the kernel does; returns the action. Knows the instructions seccompiler and the
    /// search use, and fails on any other.
    fn run(program: &[sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, arg) in args.iter().enumerate() {
            data[16 + i * 8..24 + i * 8].copy_from_slice(&arg.to_le_bytes());
        }
        let (mut a, mut pc, mut steps) = (0u32, 0usize, 0);
        loop {
            steps += 1;
            assert!(steps < 10_000, "the program loops");
            let insn = &program[pc];
            let k = insn.k;
            let jump = |taken: bool| 1 + if taken { insn.jt } else { insn.jf } as usize;
            pc += match insn.code {
                0x20 => {
                    let at = k as usize;
                    a = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
                    1
                }
                0x00 => {
                    a = k;
                    1
                }
                0x54 => {
                    a &= k;
                    1
                }
                0x05 => 1 + k as usize,
                0x15 => jump(a == k),
                0x25 => jump(a > k),
                0x35 => jump(a >= k),
                0x45 => jump(a & k != 0),
                0x06 => return k,
                code => panic!("instruction {code:#x} at {pc}"),
            };
        }
    }

    /// Argument values that reach every branch of `json`'s rules: each rule's values, one
    /// above and one below, with every mask's bits set, and some noise.
    fn argument_sets(json: &serde_json::Value) -> Vec<[u64; 6]> {
        let mut values = vec![0u64, 1, u64::MAX, 0xffff_ffff, 0x1_0000_0000];
        for thread in json.as_object().unwrap().values() {
            for rule in thread["filter"].as_array().unwrap() {
                for arg in rule["args"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
                    let v = arg["val"].as_u64().unwrap();
                    values.extend([v, v.wrapping_add(1), v.wrapping_sub(1)]);
                    if let Some(mask) = arg["op"]["masked_eq"].as_u64() {
                        values.extend([v | mask, mask, v ^ mask]);
                    }
                }
            }
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut noise = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut sets: Vec<[u64; 6]> = values.iter().map(|&v| [v; 6]).collect();
        for _ in 0..200 {
            let pick = |n: u64| values[(n % values.len() as u64) as usize];
            sets.push(std::array::from_fn(|_| pick(noise())));
        }
        sets
    }

    #[test]
    fn the_search_decides_as_seccompilers_chain_does() {
        let text = include_bytes!("../filters/x86_64.json");
        let json: serde_json::Value = serde_json::from_slice(text).unwrap();
        let chains =
            seccompiler::compile_from_json(&text[..], seccompiler::TargetArch::x86_64).unwrap();
        let searched = compile(text).unwrap();
        let sets = argument_sets(&json);
        const X86_64: u32 = 0xc000_003e;
        for (thread, chain) in &chains {
            let search = &searched[thread];
            for nr in (0..520).chain([1 << 30, u32::MAX]) {
                for arch in [X86_64, 0x4000_0003] {
                    for args in &sets {
                        assert_eq!(
                            run(search, nr, arch, *args),
                            run(chain, nr, arch, *args),
                            "{thread}: system call {nr}, arch {arch:#x}, args {args:x?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_search_is_a_few_comparisons_deep() {
        let text = include_bytes!("../filters/x86_64.json");
        for (thread, program) in compile(text).unwrap() {
            // The steps to the default action for a number no rule names: the prologue, the
            // search, and the leaf's one comparison.
            let mut data_steps = 0;
            let mut pc = PROLOGUE;
            while program[pc].code != 0x06 {
                data_steps += 1;
                pc += match program[pc].code {
                    JGE_K => 1 + program[pc].jf as usize,
                    JEQ_K => 1 + program[pc].jf as usize,
                    JA => 1 + program[pc].k as usize,
                    _ => break,
                };
            }
            assert!(data_steps <= 16, "{thread}: {data_steps} steps");
        }
    }

    #[test]
    fn a_filter_with_no_rules_is_seccompilers_own() {
        let text = br#"{"t": {"default_action": "trap", "filter_action": "allow", "filter": []}}"#;
        let chains =
            seccompiler::compile_from_json(&text[..], seccompiler::TargetArch::x86_64).unwrap();
        assert_eq!(compile(text).unwrap()["t"], chains["t"]);
    }

    #[test]
    fn seccompilers_errors_are_kept() {
        let text = br#"{"t": {"default_action": "trap", "filter_action": "allow",
            "filter": [{"syscall": "no_such_call"}]}}"#;
        let error = compile(text).unwrap_err();
        assert!(error.contains("no_such_call"), "{error}");
    }
}
