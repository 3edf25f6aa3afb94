// SPDX-License-Identifier: GPL-2.0
/*
 * The destination table's longest-prefix match (see fusion_lpm.h for the shape of the trie).
 *
 * Insertion walks down from the family's root. At each node it compares the new prefix with the
 * node's, and one of four things holds:
 *   - the node's prefix covers the new one and is as long: the node becomes that rule;
 *   - it covers it and is shorter: go on into the child the next bit picks (or hang the new
 *     rule there if that child is empty);
 *   - the new prefix covers the node's: the new rule takes the node's place, the node hangs
 *     under it;
 *   - they part at some bit before either ends: a branch node of their common bits takes the
 *     node's place, with the node and the new rule as its two children.
 * Each insertion adds at most two nodes, hence at most 2n - 1 for n rules.
 *
 * A lookup walks the same way, remembering the last rule whose prefix matched, and stops at the
 * first node that does not match: no prefix under it can. Prefix lengths grow strictly on the
 * way down, so it visits at most one node per length.
 */
#include <linux/bitops.h>
#include <linux/errno.h>
#include <linux/minmax.h>
#include <linux/socket.h>
#include <linux/string.h>

#include "fusion_lpm.h"

static const u8 fusion_lpm_bits[FUSION_LPM_FAMILIES] = {
	[FUSION_LPM_INET] = 32,
	[FUSION_LPM_INET6] = 128,
};

void fusion_lpm_init(struct fusion_lpm *lpm, struct fusion_lpm_node *nodes, u32 max_nodes)
{
	memset(lpm, 0, sizeof(*lpm));
	lpm->nodes = nodes;
	lpm->max_nodes = max_nodes;
	lpm->n_nodes = 1;	/* node 0 stands for "none" */
}

/* An address in network order as a key: host-order words, the first bits in word 0. */
void fusion_lpm_key_of(u8 family, const void *addr, u32 key[FUSION_LPM_KEY_WORDS])
{
	const __be32 *words = addr;
	int i;

	memset(key, 0, FUSION_LPM_KEY_WORDS * sizeof(u32));
	for (i = 0; i < (family == AF_INET6 ? FUSION_LPM_KEY_WORDS : 1); i++)
		key[i] = be32_to_cpu(words[i]);
}

/* Bit `pos` of a key, counting from the most significant bit of word 0. */
static unsigned int fusion_lpm_bit(const u32 *key, u32 pos)
{
	return (key[pos / 32] >> (31 - pos % 32)) & 1;
}

/* How many leading bits a and b share, at most `max`. */
static u32 fusion_lpm_common(const u32 *a, const u32 *b, u32 max)
{
	u32 i, n = 0;

	for (i = 0; i < FUSION_LPM_KEY_WORDS && n < max; i++) {
		u32 diff = a[i] ^ b[i];

		if (diff)
			return min(n + 31 - __fls(diff), max);
		n += 32;
	}
	return min(n, max);
}

static u32 fusion_lpm_new_node(struct fusion_lpm *lpm, const u32 *key, u8 len, u16 value)
{
	struct fusion_lpm_node *n = &lpm->nodes[lpm->n_nodes];
	u32 i;

	/* keep the first len bits of key */
	for (i = 0; i < FUSION_LPM_KEY_WORDS; i++) {
		if (len >= 32 * (i + 1))
			n->key[i] = key[i];
		else if (len > 32 * i)
			n->key[i] = key[i] & ~(U32_MAX >> (len - 32 * i));
		else
			n->key[i] = 0;
	}
	n->len = len;
	n->value = value;
	n->child[0] = n->child[1] = FUSION_LPM_NONE;
	return lpm->n_nodes++;
}

/* Add one rule; -EEXIST when its prefix is already a rule, -ENOSPC past max_nodes. */
int fusion_lpm_insert(struct fusion_lpm *lpm, enum fusion_lpm_family family,
		      const u32 key[FUSION_LPM_KEY_WORDS], u8 len, u16 value)
{
	u32 *slot = &lpm->root[family];
	struct fusion_lpm_node *n;
	u32 common, fresh, branch;

	if (lpm->n_nodes + 2 > lpm->max_nodes)
		return -ENOSPC;
	while (*slot != FUSION_LPM_NONE) {
		n = &lpm->nodes[*slot];
		common = fusion_lpm_common(n->key, key, min(n->len, len));
		if (common == n->len && n->len == len) {
			if (n->value != FUSION_LPM_BRANCH)
				return -EEXIST;
			n->value = value;
			return 0;
		}
		if (common == n->len) {
			slot = &n->child[fusion_lpm_bit(key, n->len)];
			continue;
		}
		if (common == len) {
			fresh = fusion_lpm_new_node(lpm, key, len, value);
			lpm->nodes[fresh].child[fusion_lpm_bit(n->key, len)] = *slot;
			*slot = fresh;
			return 0;
		}
		branch = fusion_lpm_new_node(lpm, key, common, FUSION_LPM_BRANCH);
		fresh = fusion_lpm_new_node(lpm, key, len, value);
		lpm->nodes[branch].child[fusion_lpm_bit(key, common)] = fresh;
		lpm->nodes[branch].child[fusion_lpm_bit(n->key, common)] = *slot;
		*slot = branch;
		return 0;
	}
	*slot = fusion_lpm_new_node(lpm, key, len, value);
	return 0;
}

/* The value of the longest rule matching key, or -1 when none does. */
int fusion_lpm_lookup(const struct fusion_lpm *lpm, enum fusion_lpm_family family,
		      const u32 key[FUSION_LPM_KEY_WORDS])
{
	u32 idx = lpm->root[family];
	int best = -1;

	while (idx != FUSION_LPM_NONE) {
		const struct fusion_lpm_node *n = &lpm->nodes[idx];

		if (fusion_lpm_common(n->key, key, n->len) != n->len)
			break;
		if (n->value != FUSION_LPM_BRANCH)
			best = n->value;
		if (n->len == fusion_lpm_bits[family])
			break;
		idx = n->child[fusion_lpm_bit(key, n->len)];
	}
	return best;
}
