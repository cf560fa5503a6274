/**
 * The smallest embedded pool: label `small` (metastatic) packed onto local backing label `large`, for
 * tests about the stack around the pool rather than about placement.
 */
export function smallOnLarge(options: { maxParallelJobs?: number; maxServers?: number } = {}): string {
  return `
providers:
  - name: local
    driver: local
    pools:
      - name: main
${options.maxServers === undefined ? '' : `        max-servers: ${options.maxServers}\n`}        labels:
          - name: large
  - name: meta
    driver: metastatic
    pools:
      - name: main
        labels:
          - name: small
            backing-label: large
            max-parallel-jobs: ${options.maxParallelJobs ?? 2}
`;
}
