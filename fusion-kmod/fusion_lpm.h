/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Longest-prefix match over a destination table: a path-compressed binary trie, one per address
 * family, built once when a table is installed and only read afterwards.
 *
 * A new flow looks up its destination once, in softirq or process context, under RCU. A scan of
 * the rules costs one comparison per rule; the trie costs one node per distinct prefix length on
 * the destination's path: at most 33 nodes for IPv4, 129 for IPv6, whatever the table's size.
 *
 * Every node holds a prefix (its leading bits, host order, word 0 first; IPv4 in word 0) and two
 * children, chosen by the first bit after the prefix. A node is either a rule (it carries the
 * rule's profile index) or a branch where two rules part (no value). Chains of single-child
 * nodes are never built, so n rules make at most 2n - 1 nodes, allocated with the table: the
 * trie never grows after it is published, and goes with the table when RCU frees it.
 */
#ifndef _FUSION_LPM_H
#define _FUSION_LPM_H

#include <linux/in6.h>
#include <linux/types.h>

#define FUSION_LPM_NONE		0	/* no node: node 0 is never used */
#define FUSION_LPM_BRANCH	U16_MAX	/* value of a node that is no rule */
#define FUSION_LPM_KEY_WORDS	4	/* 128 bits */

enum fusion_lpm_family {
	FUSION_LPM_INET,
	FUSION_LPM_INET6,
	FUSION_LPM_FAMILIES,
};

struct fusion_lpm_node {
	u32 key[FUSION_LPM_KEY_WORDS];	/* the prefix, bits past len zero */
	u32 child[2];			/* node indices, FUSION_LPM_NONE when absent */
	u16 value;			/* profile index, or FUSION_LPM_BRANCH */
	u8 len;				/* prefix length in bits */
};

struct fusion_lpm {
	u32 root[FUSION_LPM_FAMILIES];
	u32 n_nodes;			/* nodes[1 .. n_nodes - 1] are in use */
	u32 max_nodes;
	struct fusion_lpm_node *nodes;
};

/* Nodes a trie of n_rules rules may need, node 0 included. */
static inline u32 fusion_lpm_nodes_for(u32 n_rules)
{
	return 2 * n_rules + 1;
}

void fusion_lpm_init(struct fusion_lpm *lpm, struct fusion_lpm_node *nodes, u32 max_nodes);
void fusion_lpm_key_of(u8 family, const void *addr, u32 key[FUSION_LPM_KEY_WORDS]);
int fusion_lpm_insert(struct fusion_lpm *lpm, enum fusion_lpm_family family,
		      const u32 key[FUSION_LPM_KEY_WORDS], u8 len, u16 value);
int fusion_lpm_lookup(const struct fusion_lpm *lpm, enum fusion_lpm_family family,
		      const u32 key[FUSION_LPM_KEY_WORDS]);

#endif /* _FUSION_LPM_H */
