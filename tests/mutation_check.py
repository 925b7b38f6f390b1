"""The mutation check of docs/seeds.md: each rule's code disabled in turn, in a copy of
the tree, and the rule's unit tests run there; a mutation its tests do not fail on is a
rule no test holds. Run it by hand (it is no test itself): `.venv/bin/python
tests/mutation_check.py [rule ...]`; it prints one line per mutation and exits 1 when one
survives or no longer applies (its code changed: update its text here)."""

# The mutations quote the code they change as it is written, long lines included.
# ruff: noqa: E501

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MUTATIONS", "Mutation", "main"]

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Mutation:
    rule: str
    module: str  # under stream/instanced_stream/
    old: str  # the code, found exactly once
    new: str  # what it becomes
    tests: tuple[str, ...]  # under tests/unit/
    root: str = "stream/instanced_stream"  # where `module` is (the bench: its own package)


BENCH = "packages/bench/src/instanced_stream_bench"


MUTATIONS = [
    Mutation(
        "hundred",
        "harness/seeds.py",
        'rest = list(dict.fromkeys(c["comment"] for c in comments(400)))[:97]',
        'rest = [c["comment"] for c in comments(400)][:97]',
        (
            "harness/test_seeds.py::test_the_seed_s_hundred_comments_are_a_hundred_instances_of_one_request",
        ),
        BENCH,
    ),
    Mutation(
        "on_modes",
        "core/prompt.py",
        'speak = {"request": True, "start": turn == 1, "finish": True}',
        'speak = {"request": True, "start": True, "finish": True}',
        ("harness/test_seeds.py::test_on_modes_per_turn",),
    ),
    Mutation(
        "finish_stop",
        "core/finish.py",
        "    if not votes:\n        return None\n    shares = aggregate(votes).distribution",
        "    return None\n    shares = aggregate(votes).distribution",
        (
            "runtime/pipeline/outcomes/test_records.py::test_a_finish_stop_records_the_calls_it_does_not_run",
        ),
    ),
    Mutation(
        "stop_drops_calls",
        "core/eager.py",
        '    out.dropped = unrun_by_stop(spec, calls, "the workflow ended, unrun")\n',
        "",
        (
            "runtime/pipeline/outcomes/test_records.py::test_a_finish_stop_records_the_calls_it_does_not_run",
        ),
    ),
    Mutation(
        "stop_without_plan",
        "runtime/pipeline/outcomes/records.py",
        '                effects = TurnEffects(dropped=unrun_by_stop(self.spec, calls, "not run"))',
        "                pass",
        (
            "runtime/pipeline/outcomes/test_records.py::test_a_finish_stop_without_a_plan_runs_none_of_the_answer_s_calls",
        ),
    ),
    Mutation(
        "consult_question",
        "core/validate.py",
        'question = str(outcome.arguments.get("question") or "")',
        'question = ""',
        ("harness/test_seeds.py::test_the_consult_call_carries_the_model_s_question",),
    ),
    Mutation(
        "votes_independent",
        "core/advice.py",
        "scores[str(option)] = number / 100",
        "scores[str(option)] = number / max(1.0, sum(float(v) for v in raw.values()))",
        ("core/test_advice.py",),
    ),
    Mutation(
        "weight_shown",
        "core/prompt.py",
        'exclude={"type", "gates", "instance"}',
        'exclude={"type", "gates", "instance", "weight"}',
        ("core/test_advice_gate.py::test_the_model_sees_each_advisor_s_weight",),
    ),
    Mutation(
        "heard_on_reask",
        "core/solve.py",
        '    the re-asked instances are decided with the advice the seeds say comes first."""\n    shown = []',
        '    the re-asked instances are decided with the advice the seeds say comes first."""\n    return []\n    shown = []',
        ("core/test_advice_gate.py",),
    ),
    Mutation(
        "request_wide_gates",
        "core/advice.py",
        "or bool(advisor and advisor.gates)",
        "or False",
        ("core/test_advice_gate.py",),
    ),
    Mutation(
        "advisor_kind_or_type",
        "core/spec.py",
        'validation_alias=AliasChoices("type", "kind")',
        'validation_alias=AliasChoices("type")',
        (
            "harness/test_seeds.py::test_the_seeds_advisor_registers_with_kind_or_type_and_a_cyrillic_id",
        ),
    ),
    Mutation(
        "one_instance_no_token",
        "core/validate.py",
        '            token = next(iter(known))\n            raw = {**raw, "_instance": token}',
        "            pass",
        (
            "harness/test_seeds.py::test_the_seeds_advisor_response_parses_validates_and_keeps_its_scores",
        ),
    ),
    Mutation(
        "lazy_nothing_latent",
        "core/validate.py",
        "            if any(v is not None for v in args.values()):\n                return Refusal(",
        "            if False:\n                return Refusal(",
        (
            "core/test_plan_rules.py::test_a_latent_result_in_a_lazy_plan_is_refused_and_the_plan_asked_again",
        ),
    ),
    Mutation(
        "lazy_outside_plan",
        "core/lazy.py",
        "            if id(call) not in answered and is_step(spec, call):",
        "            if False:",
        (
            "runtime/pipeline/outcomes/test_records.py::test_a_call_outside_the_approved_graph_is_a_dead_letter",
        ),
    ),
    Mutation(
        "lazy_revision",
        "core/lazy.py",
        '    st.plan, st.status, st.revising = [], "ready", True',
        '    st.plan, st.status, st.revising = [], "ready", False',
        (
            "core/test_lazy.py::test_a_rejected_plan_is_planned_again_with_its_reason_up_to_max_revisions",
        ),
    ),
    Mutation(
        "eager_waits",
        "core/plan_graph.py",
        "                continue  # a producer still runs: wait for it",
        "                pass",
        ("core/test_plan_graph.py",),
    ),
    Mutation(
        "graph_not_answer_order",
        "core/plan_graph.py",
        "        for k, other in enumerate(graph)\n        if k != index and",
        "        for k, other in enumerate(graph)\n        if k < index and",
        ("core/test_plan_graph.py",),
    ),
    Mutation(
        "branch_skip",
        "core/plan_graph.py",
        '    the same place). A step reading both alternatives of a branch reads the one taken."""\n',
        '    the same place). A step reading both alternatives of a branch reads the one taken."""\n    return False\n',
        ("core/test_plan_graph.py",),
    ),
    Mutation(
        "ran_on_missing_input",
        "core/plan_graph.py",
        "        if written and not any(_exists(state, w) for w in written):\n            return True\n    return False",
        "        pass\n    return False",
        ("core/test_plan_graph.py",),
    ),
    Mutation(
        "skipped_input",
        "core/plan_graph.py",
        "                counts[why] = counts.get(why, 0) + 1",
        "                counts[SKIPPED_BRANCH] = counts.get(SKIPPED_BRANCH, 0) + int(not failed)",
        ("core/test_plan_graph.py",),
    ),
    Mutation(
        "plan_problem_cycle",
        "core/plan_graph.py",
        "    loop = _cycle(steps)\n",
        "    loop = None\n",
        ("core/test_plan_graph.py",),
    ),
    Mutation(
        "plan_problem_unwritten",
        "core/plan_graph.py",
        "            if not any(_overlap(path, o) for o in written) and not _exists(state, path):",
        "            if False:",
        ("core/test_plan_graph.py",),
    ),
    Mutation(
        "plan_check_in_validator",
        "core/validate.py",
        "        if self._spec.plan is not None:\n            self._check_plans(verdict, states or {})",
        "        pass",
        ("core/test_plan_graph.py",),
    ),
    Mutation(
        "latent_waits",
        "core/eager.py",
        "                if call is not None and step.output:",
        "                if False:",
        ("core/test_plan_graph.py",),
    ),
    Mutation(
        "due_answered_first",
        "core/eager.py",
        "        answered = {id(c) for _, c in _answer_due(st, calls)}",
        "        answered: set[int] = set()",
        ("core/test_plan_graph.py",),
    ),
    Mutation(
        "thought_no_step",
        "core/plan_graph.py",
        "            continue  # a thought: ephemeral (the seeds), never stored, nothing reads it",
        "            pass",
        ("core/test_plan_rules.py::test_a_thought_is_no_step_of_a_plan",),
    ),
    Mutation(
        "thought_not_published",
        "runtime/pipeline/outcomes/records.py",
        "outputs = [\n            c.wire()\n            for cid, c in calls\n            if flow is None and _latent_output(self.spec, c) and cid not in effects.dropped\n        ]",
        'outputs = [\n            c.wire()\n            for cid, c in calls\n            if flow is None and self.spec.tool(c.tool).kind == "latent" and cid not in effects.dropped  # type: ignore[union-attr]\n        ]',
        ("runtime/pipeline/outcomes/test_records.py",),
    ),
    Mutation(
        "thoughts_any_number",
        "core/validate.py",
        '        if self._tools[call.tool].kind == "latent" and not call.output_path:\n            calls.append(call)\n            return',
        "        pass",
        ("runtime/pipeline/outcomes/test_records.py",),
    ),
    Mutation(
        "thought_text_not_in_letters",
        "core/validate.py",
        "        verdict.refusals = [self._unthought(r) for r in verdict.refusals]",
        "        pass",
        ("runtime/pipeline/outcomes/test_records.py",),
    ),
    Mutation(
        "planless_latent_on_activity",
        "runtime/pipeline/outcomes/records.py",
        "        latent=latent or [],",
        "        latent=[],",
        (
            "runtime/pipeline/outcomes/test_records.py::test_a_planless_latent_output_rides_on_the_activity_record",
        ),
    ),
    Mutation(
        "planless_latent_on_no_action",
        "runtime/pipeline/outcomes/records.py",
        "                    latent=outputs,  # without a plan, the answer's latent outputs go here too",
        "",
        ("runtime/pipeline/outcomes/test_records.py",),
    ),
    Mutation(
        "output_spelling",
        "core/validate.py",
        '                raw = {k: v for k, v in raw.items() if k != "output"} | {"_outputPath": value}',
        "                pass",
        (
            "harness/test_seeds.py::test_the_seed_s_output_spelling_is_read_as_the_output_path_never_an_argument",
        ),
    ),
    Mutation(
        "latent_branch_collapses",
        "core/plan_graph.py",
        "    return chosen if chosen in paths else paths[0]",
        '    return step.output or ""',
        (
            "core/test_plan_graph.py::test_a_latent_branch_collapses_to_its_first_path_on_the_eager_turn",
        ),
    ),
    Mutation(
        "latent_branch_later_turn",
        "core/plan_graph.py",
        "    return chosen if chosen in paths else paths[0]",
        "    return paths[0]",
        (
            "core/test_plan_graph.py::test_a_later_turn_answering_a_due_latent_branch_names_the_path_it_takes",
        ),
    ),
    Mutation(
        "declared_paths",
        "core/call_paths.py",
        "    if tool.paths and not set(paths) <= set(tool.paths):",
        "    if False:",
        ("harness/test_seeds.py::test_output_paths_must_be_state_paths_the_tool_declares",),
    ),
    Mutation(
        "scopes_resolve",
        "core/call_paths.py",
        "    if unknown:\n",
        "    if False:\n",
        ("harness/test_seeds.py::test_scopes_resolve_or_are_refused",),
    ),
    Mutation(
        "input_override",
        "runtime/pipeline/outcomes/scopes.py",
        '        merged.update({k: v for k, v in inst.payload.items() if k != "type"})',
        '        merged = {**{k: v for k, v in inst.payload.items() if k != "type"}, **merged}',
        ("harness/test_seeds.py::test_an_instance_input_overrides_the_global_one_in_its_scopes",),
    ),
    Mutation(
        "shown_ids",
        "core/validate.py",
        "    if isinstance(name, str) and name not in known and name in shown:",
        "    if False:",
        ("harness/test_seeds.py::test_the_instancing_seed_s_manager_answer_names_a_shown_id",),
    ),
    Mutation(
        "silence_no_action",
        "core/solve.py",
        "            answered |= self._silent(verdict, tokens, by_token, out, attempt, set(why))",
        "            pass",
        (
            "harness/test_seeds.py::test_the_seed_s_silent_employee_ends_in_no_action_without_a_re_ask",
        ),
    ),
    Mutation(
        "output_schema",
        "core/binding.py",
        "    return None if tool is None else _output_error(tool, rec.value)",
        "    return None",
        (
            "core/test_result_safety.py",
            "core/test_workflow.py",
        ),
    ),
    Mutation(
        "opinion_schema",
        "core/validate.py",
        "error = best_match(self._opinion_validators[advisor.id].iter_errors(fields))",
        "error = None",
        ("harness/test_seeds.py::test_an_opinion_that_breaks_its_advisor_s_schema_is_marked",),
    ),
    Mutation(
        "advisor_ids_unique",
        "core/spec.py",
        '            raise ValueError("advisor ids must be unique")',
        "            pass",
        ("harness/test_seeds.py::test_two_advisors_with_one_id_are_refused_at_load",),
    ),
    Mutation(
        "context_kind_recognised",
        "runtime/pipeline/intake.py",
        "    if declared is not None:\n        raise _context_on_input(declared, payload, source, context_topic)\n",
        "",
        ("runtime/pipeline/test_intake.py::test_a_context_kind_on_the_input_topic_is_no_item",),
    ),
    Mutation(
        "keyed_input_stays_an_item",
        "core/context_kind.py",
        '    if kind == "input" and (payload.get("_instance") is not None or key is not None):\n        return None\n',
        "",
        ("runtime/pipeline/test_intake.py::test_a_record_without_a_context_kind_stays_an_item",),
    ),
    Mutation(
        "context_forwarded",
        "runtime/pipeline/admission.py",
        "            if exc.code == CONTEXT_ON_INPUT and self._forwards(exc):",
        "            if False:",
        (
            "runtime/pipeline/test_forwarding.py::test_a_context_message_on_the_input_topic_is_forwarded_to_the_context_topic",
        ),
    ),
    Mutation(
        "context_off_by_default",
        "runtime/pipeline/admission.py",
        '        return self.live.spec.accept_context_input and bool(refused.data.get("forwardable"))',
        '        return bool(refused.data.get("forwardable"))',
        (
            "runtime/pipeline/test_forwarding.py::test_a_context_message_is_a_dead_letter_unless_the_spec_forwards_them",
        ),
    ),
    Mutation(
        "context_plan",
        "core/overrides.py",
        "            trial_plan = message\n",
        "            pass\n",
        ("runtime/pipeline/test_overrides.py::test_a_context_plan_replaces_the_specs_plan",),
    ),
    Mutation(
        "forward_audited",
        "ops/audit.py",
        '        mark({"topic": first_at[0], "partition": first_at[1], "offset": first_at[2]})',
        "        pass",
        (
            "ops/test_audit.py::test_a_context_message_forwarded_from_the_input_topic_is_its_outcome",
        ),
    ),
    Mutation(
        "advisor_for_one_instance",
        "core/prompt.py",
        "            if a.on is not None and speak[a.on] and a.instance in (None, instance)",
        "            if a.on is not None and speak[a.on]",
        (
            "core/test_solve.py::test_an_advisor_defined_for_one_instance_speaks_about_that_instance_only",
        ),
    ),
    Mutation(
        "advisor_instance_needs_instanced",
        "core/spec.py",
        "        if self.instance is not None and not self.is_instanced:",
        "        if False:",
        ("core/test_solve.py::test_an_advisor_for_one_instance_must_be_instanced",),
    ),
    Mutation(
        "stateless_state_update",
        "runtime/pipeline/outcomes/records.py",
        "        if len(out.records) == first and outputs:",
        "        if False:",
        (
            "runtime/pipeline/outcomes/test_records.py::test_a_planless_answer_of_only_state_writes_is_the_instance_s_state_update",
        ),
    ),
    Mutation(
        "lint_paths",
        "ops/spec_lint.py",
        "    lint.refused.extend(_paths_without_dagger(spec))\n",
        "",
        ("ops/test_spec_lint.py::test_a_tool_path_without_the_dagger_is_refused_in_one_line",),
    ),
    Mutation(
        "lint_schema",
        "ops/spec_lint.py",
        '        if "schema_" not in advisor.model_fields_set:',
        "        if False:",
        ("ops/test_spec_lint.py::test_an_advisor_without_a_schema_is_warned_of",),
    ),
    Mutation(
        "lint_scopes",
        "ops/spec_lint.py",
        "            if known is not None and top not in known:",
        "            if False:",
        ("ops/test_spec_lint.py::test_an_advisor_scope_on_a_field_nothing_writes_is_warned_of",),
    ),
    Mutation(
        "lint_plan_names",
        "ops/spec_lint.py",
        "    lint.warnings.extend(_plan_names(spec))\n",
        "",
        ("ops/test_spec_lint.py::test_a_plan_naming_an_undeclared_tool_is_warned_of",),
    ),
    Mutation(
        "idea_counts_commits",
        "runtime/state/idea_tally.py",
        "        self.tally.apply(self._pending)\n",
        "",
        (
            "runtime/state/test_idea_tally.py::test_each_commit_counts_on_what_the_commits_before_it_counted",
        ),
    ),
    Mutation(
        "idea_restore",
        "runtime/state/store.py",
        "                self.ideas.apply({key: None if parsed is None else share_of(parsed)})",
        "                pass",
        ("runtime/state/test_idea_tally.py::test_a_restore_counts_what_the_changelog_holds",),
    ),
    Mutation(
        "idea_rides_the_commit",
        "runtime/units/unit.py",
        "                records = [*records, *self.annex.staged(records)]",
        "                self.annex.staged(records)",
        (
            "runtime/state/test_idea_tally.py::test_the_record_rides_the_commit_of_the_changes_it_counts",
        ),
    ),
    Mutation(
        "idea_buckets",
        "core/idea_process.py",
        '    "due": "running",',
        '    "due": "waiting",',
        ("core/test_idea_process.py::test_every_step_status_has_its_bucket",),
    ),
    Mutation(
        "idea_edges",
        "core/idea_process.py",
        "        for p in depends_on(graph, k)\n",
        "        for p in depends_on(graph, k)[:0]\n",
        (
            "core/test_idea_process.py::test_a_share_names_nodes_by_tool_and_output_and_links_reader_to_producer",
        ),
    ),
    Mutation(
        "idea_partition_once",
        "core/idea_process.py",
        "        if rec.partition not in newest or rec.at > newest[rec.partition].at:",
        "        if True:",
        ("core/test_idea_process.py::test_partitions_are_summed_and_each_partition_counts_once",),
    ),
    Mutation(
        "thought_first",
        "core/prompt.py",
        '        for tool in sorted(self.tools, key=lambda t: not (t.kind == "latent" and not t.paths)):',
        "        for tool in self.tools:",
        ("core/test_plan_rules.py::test_the_compact_answer_writes_thoughts_before_the_steps",),
    ),
    Mutation(
        "thought_on_planning",
        "core/validate.py",
        '        if planning and self._tools[tool].kind == "latent" and not thought:',
        '        if planning and self._tools[tool].kind == "latent":',
        (
            "core/test_plan_rules.py::test_a_thought_on_a_lazy_planning_turn_is_kept_not_a_reason_to_ask_again",
        ),
    ),
    Mutation(
        "finish_continue",
        "core/workflow.py",
        '        if say == "continue" and when == "no_call" and _ended_done(out, st):',
        "        if False:",
        (
            "core/test_finish.py::test_continue_keeps_an_instance_whose_answer_proposes_no_call_going",
        ),
    ),
    Mutation(
        "finish_when_deciding",
        "core/finish.py",
        '    if not any(lazy.is_step(spec, c) for _, c in calls):\n        return "no_call"\n    return None',
        '    return "limit"',
        ("core/test_finish.py::test_stop_mid_plan_changes_nothing_and_at_the_limit_ends_it_unrun",),
    ),
    Mutation(
        "finish_judged_only",
        "core/finish.py",
        "        judged = op.token is not None or alone",
        "        judged = True",
        (
            "core/test_finish.py::test_a_request_wide_finish_advisor_never_judges_an_instance_of_a_larger_request",
        ),
    ),
]


def _run(tree: Path, m: Mutation) -> str:
    path = tree / m.root / m.module
    src = path.read_text()
    if src.count(m.old) != 1:
        return f"NOT APPLIED (found {src.count(m.old)} times)"
    path.write_text(src.replace(m.old, m.new))
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-x",
                "-p",
                "no:randomly",
                "-p",
                "no:cacheprovider",
                *(f"tests/unit/{t}" for t in m.tests),
            ],
            cwd=tree,
            # The copies first: the installed (editable) packages are the real tree's.
            env={**os.environ, "PYTHONPATH": f"{tree / 'stream'}:{tree / BENCH.rsplit('/', 1)[0]}"},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        path.write_text(src)
    return "killed" if done.returncode != 0 else "SURVIVED"


def main(rules: list[str]) -> int:
    failed = 0
    with tempfile.TemporaryDirectory(prefix="stream-mutants-") as tmp:
        tree = Path(tmp)
        for part in ("stream", "packages", "tests", "examples", "schemas", "docs"):
            shutil.copytree(ROOT / part, tree / part)
        for name in ("pyproject.toml", "asyncapi.yaml"):
            shutil.copy(ROOT / name, tree / name)
        for m in MUTATIONS:
            if rules and m.rule not in rules:
                continue
            verdict = _run(tree, m)
            failed += verdict != "killed"
            print(f"{m.rule}: {verdict}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
