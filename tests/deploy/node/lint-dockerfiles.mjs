// lint-dockerfiles.mjs - checks Dockerfiles without a Docker engine:
// dockerfile-utils' linter (the one behind VS Code's Docker support) with
// every rule an error, then what zps's images promise:
//   - multi-stage: at least two stages, each named, each base image pinned
//     to a tag (not latest);
//   - every COPY --from names an earlier stage;
//   - the last stage runs as a user that is not root;
//   - apt-get install without recommends, its lists removed in the same RUN;
//   - the last stage installs no compiler and no -dev package.
// Prints one line per check; exits 1 if any failed.
//
//   node lint-dockerfiles.mjs Dockerfile...
import { readFileSync } from "node:fs";
import { basename } from "node:path";
import { DockerfileParser } from "dockerfile-ast";
import { validate, ValidationSeverity } from "dockerfile-utils";

let failures = 0;
const check = (what, cond, why) => {
  if (cond) {
    console.log(`  ok: ${what}`);
  } else {
    failures++;
    console.log(`  FAILED: ${what}${why ? `\n    ${why}` : ""}`);
  }
};

const E = ValidationSeverity.ERROR;
const strict = {
  deprecatedMaintainer: E, directiveCasing: E, emptyContinuationLine: E, instructionCasing: E,
  instructionCmdMultiple: E, instructionEntrypointMultiple: E, instructionHealthcheckMultiple: E,
  instructionJSONInSingleQuotes: E, instructionWorkdirRelative: E,
};

for (const file of process.argv.slice(2)) {
  const name = basename(file);
  const text = readFileSync(file, "utf8");
  console.log(name);

  const diags = validate(text, strict);
  check(`${name}: dockerfile-utils finds nothing`, diags.length === 0,
    diags.map((d) => `line ${d.range.start.line + 1}: ${d.message}`).join("\n    "));

  const stages = DockerfileParser.parse(text).getFROMs().map((from) => ({
    image: from.getImage(),
    name: from.getBuildStage(),
    line: from.getRange().start.line,
  }));
  check(`${name}: multi-stage (${stages.length} stages)`, stages.length >= 2);
  for (const s of stages) {
    check(`${name}: FROM ${s.image} AS ${s.name}: named, pinned to a tag`,
      s.name && /:[^:/]+$/.test(s.image) && !/:latest$/.test(s.image));
  }

  // Instructions with their stage (the index of the last FROM above them).
  // args: the instruction's whole text (flags included), less its keyword.
  const lines = text.split("\n");
  const instrs = DockerfileParser.parse(text).getInstructions().map((i) => ({
    keyword: i.getKeyword(),
    args: lines.slice(i.getRange().start.line, i.getRange().end.line + 1).join("\n")
      .replace(/^\s*\S+/, ""),
    stage: stages.filter((s) => s.line <= i.getRange().start.line).length - 1,
  }));
  for (const i of instrs.filter((i) => i.keyword === "COPY")) {
    const m = /--from=(\S+)/.exec(i.args);
    if (!m) continue;
    const earlier = stages.slice(0, i.stage).map((s, k) => [s.name, String(k)]).flat();
    check(`${name}: COPY --from=${m[1]} names an earlier stage`, earlier.includes(m[1]));
  }
  const last = stages.length - 1;
  const users = instrs.filter((i) => i.keyword === "USER" && i.stage === last);
  const user = users.length ? users[users.length - 1].args.trim() : "";
  check(`${name}: the last stage runs as USER ${user || "(none: root)"}, not root`,
    user !== "" && !/^(root|0)(:|$)/.test(user));
  for (const i of instrs.filter((i) => i.keyword === "RUN" && /apt-get install/.test(i.args))) {
    const where = `${name}: stage ${stages[i.stage].name}'s apt-get install`;
    check(`${where}: --no-install-recommends, lists removed`,
      /--no-install-recommends/.test(i.args) && /rm -rf \/var\/lib\/apt\/lists/.test(i.args));
    if (i.stage === last) {
      const dev = i.args.split(/\s+/).filter((w) => /-dev$|^build-essential$|^gcc|^g\+\+|^make$/.test(w));
      check(`${where}: runtime packages only`, dev.length === 0, dev.join(" "));
    }
  }
}
console.log(failures === 0 ? "all checks passed" : `${failures} check(s) FAILED`);
process.exit(failures === 0 ? 0 : 1);
