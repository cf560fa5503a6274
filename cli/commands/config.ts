import { writeFile } from 'node:fs/promises';
import { configJsonSchema } from '../../shared/config/jsonSchema.ts';
import { formatConfigErrors, loadConfigFile } from '../../shared/config/load.ts';
import { ShapeMessage, shapeOf } from '../../shared/core/messages.ts';
import { describeShape, formatCost, formatSize, type Shape, shapeOffers } from '../../shared/core/shapes.ts';
import { CliError } from '../errors.ts';
import { table } from '../format.ts';
import { print, printError, printJson } from '../output.ts';

/**
 * `metastatic validate FILE`: every error with its YAML path (exit 1), warnings for ignored keys, and
 * what each label's slot gives for requests by shape. The rules that depend on where the functions run
 * (shared/providers/aws/networkRules.ts) are checked as synth checks them: outside any VPC unless
 * `--functions-in-vpc`. Each `--shape` is checked against the labels: the
 * one a request by that shape would get when nothing is free (the cheapest that fits), or why none can
 * serve it (exit 1).
 */
export async function validate(
  file: string,
  opts: { json?: boolean; shape?: string[]; functionsInVpc?: boolean },
): Promise<void> {
  const shapes = (opts.shape ?? []).map(parseShapeOption);
  const result = await loadConfigFile(file, { functionsInVpc: opts.functionsInVpc === true });
  if (!result.ok) {
    if (opts.json) printJson({ valid: false, errors: result.errors, warnings: [] });
    else printError(formatConfigErrors(result.errors));
    process.exitCode = 1;
    return;
  }
  const c = result.config;
  const checked = shapes.map(({ text, shape }) => {
    const offers = shapeOffers(c, [shape]);
    const best = offers.ok ? offers.pools[0]?.perShape[0]?.[0] : undefined;
    return best
      ? {
          shape: text,
          pool: best.pool.key,
          label: best.label.name,
          slotHourlyCost: best.slotHourlyCost ?? null,
        }
      : { shape: text, pool: null, label: null, reason: offers.ok ? 'no pool' : offers.reason };
  });
  const offered = c.metastaticPools.flatMap((p) => [...p.labels.values()].map((l) => ({ pool: p.key, l })));
  const labels = offered.map(({ pool, l }) => ({
    pool,
    label: l.name,
    slot: l.slot ? slotJson(l.slot) : null,
    slotHourlyCost: l.slotHourlyCost ?? null,
  }));
  if (opts.json) {
    printJson({ valid: true, errors: [], warnings: c.notices, labels, shapes: checked });
  } else {
    print(
      `${file}: valid (${c.metastaticPools.length} metastatic pool(s), labels ${[...c.metastaticLabelNames].join(', ')})`,
    );
    for (const n of c.notices) printError(`warning: ${file}: ${n.path}: ${n.message}`);
    if (offered.some(({ l }) => l.slot) || shapes.length > 0) {
      print(
        table(
          ['POOL', 'LABEL', 'SLOT', 'COST/SLOT-HOUR'],
          offered.map(({ pool, l }) => [
            pool,
            l.name,
            l.slot ? describeShape(l.slot) : '-',
            l.slotHourlyCost === undefined ? '-' : formatCost(l.slotHourlyCost),
          ]),
        ),
      );
    }
    for (const s of checked) {
      if (s.label) print(`shape ${s.shape}: ${s.pool}/${s.label}`);
      else printError(`shape ${s.shape}: no label can serve it: ${s.reason}`);
    }
  }
  if (checked.some((s) => !s.label)) process.exitCode = 1;
}

/** A slot shape as JSON: cores, and sizes as written by formatSize. */
function slotJson(s: Shape) {
  return {
    ...(s.cores === undefined ? {} : { cores: s.cores }),
    ...(s.memoryMiB === undefined ? {} : { memory: formatSize(s.memoryMiB) }),
    ...(s.diskMiB === undefined ? {} : { disk: formatSize(s.diskMiB) }),
  };
}

/** `cores=2,memory=4GiB`: a shape as `--shape` gives it, checked as a request message's would be. */
export function parseShapeOption(text: string): { text: string; shape: Shape } {
  const fields: Record<string, unknown> = {};
  for (const part of text.split(',')) {
    const [key, value, ...rest] = part.split('=').map((x) => x.trim());
    if (!key || value === undefined || rest.length > 0)
      throw new CliError(`--shape ${text}: expected key=value pairs such as cores=2,memory=4GiB`, 2);
    fields[key] = key === 'cores' ? Number(value) : value;
  }
  const parsed = ShapeMessage.safeParse(fields);
  if (!parsed.success) {
    const why = parsed.error.issues.map((i) => `${i.path.join('.') || 'shape'}: ${i.message}`).join('; ');
    throw new CliError(`--shape ${text}: ${why}`, 2);
  }
  return { text, shape: shapeOf(parsed.data) };
}

/** `metastatic schema`: the configuration's JSON Schema, for editors. */
export async function schema(opts: { out?: string }): Promise<void> {
  const text = `${JSON.stringify(configJsonSchema(), null, 2)}\n`;
  if (opts.out) await writeFile(opts.out, text);
  else process.stdout.write(text);
}
